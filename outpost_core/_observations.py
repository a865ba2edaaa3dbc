"""What the core noticed that an operator may want to see (for telemetry and logs). The driver
drains them with ``Session.observations()``; nothing here changes behaviour."""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True)
class SnapshotApplied:
    customer: str
    snapshot_id: str
    cold_until: int
    counted: int
    meter_ids: tuple[str, ...]
    local_consumed: tuple[float, ...]
    """Per meter, the consumption this instance read before the snapshot (NaN if not followed)."""
    polar_consumed: tuple[float, ...]
    """Per meter, the consumption after it."""


@attrs.frozen(slots=True)
class LinkChanged:
    state: str
    """``open`` or ``closed``."""
    reason: str | None = None
    connections: int = 0


Observation = SnapshotApplied | LinkChanged
