"""Quantities probes of the public-API mode, sans I/O.

A probe asks ``GET /v1/meters/{id}/quantities`` for one customer's usage over the meter's
current window: Polar recomputes it on request, from a replica, instead of waiting for the
customer meter's late recompute. This module builds the request a planned probe makes, reads
its answer (whatever the peer sent: a bad body is a problem, never an error), tells the planner
what it needs of a followed customer meter (its local balance, pending events, window start),
and says what a probe's answer writes: the ledger's verdict (``MeterLedger.observe_probe``)
through ``apply_anchor.lua``, as a reading's, with the anchor's credits and ``modified_at``
unchanged (a probe carries no credits: it re-anchors consumed only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from urllib.parse import quote

import attrs

from ._keys import CustomerKind
from ._mirror import IdentityState
from ._peer import peer_json
from ._public_anchoring import (
    PUBLIC_SID,
    Anchoring,
    anchor_write,
    ledger_of,
)
from ._public_ledger import Outcome
from ._public_polls import ID_PARAMS, SECOND_US, Followed, QuantitiesProbe
from ._public_readings import MAX_BODY_BYTES
from ._time import iso

PROBE_LAG_US = 10 * SECOND_US
"""The margin for the replica's lag: an event acknowledged (on Outpost's clock) more than this
before the probe was sent is in its answer."""


def quantities_path(meter_id: str) -> str:
    return f"/v1/meters/{quote(meter_id, safe='')}/quantities"


def _second(t_us: int) -> str:
    """An instant to the second (``iso`` without its fraction), as every SDK writes it."""
    return iso(t_us - t_us % SECOND_US)[:19] + "Z"


def probe_params(probe: QuantitiesProbe) -> tuple[tuple[str, str], ...]:
    """The query of a probe's request (its window widened to whole seconds)."""
    end = probe.end_us + (-probe.end_us) % SECOND_US
    return (
        (ID_PARAMS[probe.kind], probe.customer),
        ("start_timestamp", _second(probe.start_us)),
        ("end_timestamp", _second(end)),
        ("interval", probe.interval),
    )


@attrs.frozen(slots=True)
class QuantitiesAnswer:
    total: float | None
    """The window's consumed units; ``None`` when the body is not a quantities answer."""
    problem: str | None = None


def parse_quantities(body: bytes) -> QuantitiesAnswer:
    """A quantities answer's ``total``; a body that is not one gives a problem, never raises."""
    if len(body) > MAX_BODY_BYTES:
        return QuantitiesAnswer(None, f"quantities: body of {len(body)} bytes")
    try:
        data = peer_json(body)
    except ValueError as exc:
        return QuantitiesAnswer(None, f"quantities: {exc}")
    total = data.get("total") if isinstance(data, Mapping) else None
    if isinstance(total, bool) or not isinstance(total, int | float):
        return QuantitiesAnswer(None, "quantities without a numeric total")
    number = float(total)
    if not math.isfinite(number) or number < 0:
        return QuantitiesAnswer(None, f"quantities: a total of {str(total)[:40]}")
    return QuantitiesAnswer(number)


def _window_start(pub: str | None) -> int | None:
    """The reset instant the ledger knows (``h`` of its persistent part), if readable."""
    try:
        data = peer_json(pub) if pub is not None else None
    except ValueError:
        return None
    hint = data.get("h") if isinstance(data, Mapping) else None
    return hint if isinstance(hint, int) and not isinstance(hint, bool) else None


def followed_of(
    customer: str,
    meter_id: str,
    aggregation: str,
    state: IdentityState,
    pub: str | None,
    kind: CustomerKind = "external",
) -> Followed:
    """What the planner needs of a followed customer meter, from its state hash (``state``
    derived from it, ``pub`` its ledger's persistent part): the local balance (``None`` until
    anchored, and for meters never probed), the pending events and the window's start."""
    balance = None
    anchored = state.snapshot_id == PUBLIC_SID and state.cold_until is not None
    if anchored and aggregation in ("count", "sum"):
        consumed = state.polar.merge(state.local).quantity(aggregation)
        balance = state.credits.get(meter_id, 0.0) - consumed
    window = _window_start(pub)
    return Followed(customer, meter_id, aggregation, balance, state.pending, window, kind)


def probe_anchor(
    aggregation: str,
    margin_us: int,
    fields: Mapping[str, str],
    events: Mapping[str, str],
    meter_id: str,
    consumed: float,
    sent_at_us: int,
    lag_us: int = PROBE_LAG_US,
) -> Anchoring:
    """Observe a probe's answer (``consumed``, asked at ``sent_at_us`` on Outpost's clock) on
    the ledger the state hash and its pending events hold, and say what to write (``None``:
    the answer cannot be used)."""
    problems: list[str] = []
    ledger = ledger_of(aggregation, margin_us, fields, events, problems)
    before = set(ledger.entries)
    outcome = ledger.observe_probe(consumed, sent_at_us, lag_us)
    anchor = ledger.anchor
    if outcome is Outcome.PROBE_UNUSED or anchor is None or fields.get("sid") != PUBLIC_SID:
        return Anchoring(Outcome.PROBE_UNUSED, None, tuple(problems), ledger.rejections)
    write = anchor_write(aggregation, fields, ledger, before, meter_id, anchor)
    return Anchoring(outcome, write, tuple(problems), ledger.rejections)


__all__ = [
    "PROBE_LAG_US",
    "QuantitiesAnswer",
    "followed_of",
    "parse_quantities",
    "probe_anchor",
    "probe_params",
    "quantities_path",
]
