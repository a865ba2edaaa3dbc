"""What the core asks its driver to do. Imperative names; the driver executes each and reports
the outcome back as an input (see ``_inputs.py``)."""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True)
class RunScript:
    """Run one of the scripts of ``lua/`` (by name) with EVALSHA; report its reply."""

    script: str
    keys: tuple[str, ...]
    args: tuple[str, ...]


@attrs.frozen(slots=True)
class LoadIdentity:
    """``HGETALL key``; report :class:`IdentityLoaded` or :class:`LoadFailed`."""

    key: str


@attrs.frozen(slots=True)
class StoreConfiguration:
    """``SET`` the configuration cache key to ``text`` (Polar's configuration payload, JSON)."""

    key: str
    text: str


Effect = RunScript | LoadIdentity | StoreConfiguration
