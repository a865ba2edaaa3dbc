"""What ``outpost inspect`` reports: one identity's local state beside Polar's customer meter,
and the difference explained. Pure: the command reads Redis and Polar, this computes.

The local consumption is Polar's totals before ``cold_until`` combined with every event Polar
has not counted yet (pending). Polar's customer meter counts every event it has stored, whether
or not its buckets have synced. So the two differ by the pending events Polar has stored but not
yet synced (acknowledged) and by those it has not received at all (undelivered); the report says
which of them account for the difference, and flags a local balance above Polar's (the one thing
that must not last).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from ._aggregate import Aggregate, parse_number
from ._balance import compute_balance
from ._configuration import Reducer
from ._keys import Customer, bucket_key
from ._mirror import derive_state, parse_hold
from ._peer import decimal_int
from ._time import from_us

TOLERANCE = 1e-9
"""Relative difference below which two consumptions are the same number (float sums)."""


@attrs.frozen(slots=True)
class PendingEvent:
    """One event of the events hash: Polar has not counted it yet."""

    event_id: str
    bucket_us: int
    value: float
    acknowledged_us: int | None
    """When Polar acknowledged it (µs), or ``None`` while undelivered."""


def events_keys(state_key: str, state_fields: Mapping[str, str]) -> list[str]:
    """The events hashes of an identity, oldest bucket first: one per ``a:<bucket>`` field of its
    state hash, which is the index of the buckets that hold pending events."""
    buckets = [name[2:] for name in state_fields if name.startswith("a:")]
    starts = sorted(s for s in map(decimal_int, buckets) if s is not None and s >= 0)
    return [bucket_key(state_key, start) for start in starts]


def parse_events(fields: Mapping[str, str]) -> tuple[list[PendingEvent], list[str]]:
    """The events hashes' fields as events (oldest bucket first), and the fields that could not be
    read."""
    events: list[PendingEvent] = []
    problems: list[str] = []
    for name, text in fields.items():
        bucket, _, event_id = name.partition(":")
        value_text, _, acked_text = text.partition(" ")
        value = parse_number(value_text)
        acked = decimal_int(acked_text) if acked_text[:1] != "-" else None
        start = decimal_int(bucket) if bucket[:1] != "-" else None
        if start is None or not event_id or value is None or (acked_text and acked is None):
            problems.append(f"{name}={text!r}")
            continue
        events.append(PendingEvent(event_id, start, value, acked))
    events.sort(key=lambda e: (e.bucket_us, e.event_id))
    return events, problems


def inspection(
    *,
    meter_id: str,
    customer: Customer,
    reducer: Reducer,
    state_fields: Mapping[str, str],
    event_fields: Mapping[str, str],
    now_us: int,
    polar_meter: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The report, as JSON-ready data (``--json`` prints it as is)."""
    func = reducer.aggregation.func
    state = derive_state(state_fields)
    balance = compute_balance(meter_id, customer, func, state, now_us=now_us)
    events, problems = parse_events(event_fields)
    buckets = []
    for name, text in sorted(state_fields.items()):
        aggregate = Aggregate.decode(text) if name.startswith("a:") else None
        start = decimal_int(name[2:]) if aggregate is not None else None
        if aggregate is not None and start is not None and start >= 0:
            buckets.append({"start": _iso(start), **_aggregate(aggregate)})
    local = {
        "balance": balance.balance,
        "credited": balance.credited,
        "consumed": balance.consumed,
        "polar_part": _aggregate(state.polar),
        "local_part": _aggregate(state.local),
        "pending": state.pending,
        "undelivered": state.undelivered,
        "cold_until": None if state.cold_until is None else _iso(state.cold_until),
        "snapshot_id": state.snapshot_id,
        "snapshot_age_s": None if state.as_of is None else (now_us - state.as_of) / 1e6,
        "revision": state.revision,
        "held": balance.held,
        "available": balance.available,
    }
    holds = []
    for name, text in sorted(state_fields.items()):
        hold = parse_hold(text) if name.startswith("h:") else None
        if hold is not None:
            units, expires = hold
            holds.append(
                {
                    "hold_id": name[2:],
                    "units": units,
                    "expires": _iso(expires),
                    "expires_in_s": (expires - now_us) / 1e6,
                    "expired": expires <= now_us,
                }
            )
    pending = [
        {
            "event_id": e.event_id,
            "bucket": _iso(e.bucket_us),
            "bucket_age_s": (now_us - e.bucket_us) / 1e6,
            "value": e.value,
            "acknowledged": e.acknowledged_us is not None,
            "acknowledged_age_s": None
            if e.acknowledged_us is None
            else (now_us - e.acknowledged_us) / 1e6,
        }
        for e in events
    ]
    polar = None
    if polar_meter is not None:
        polar = {
            "credited": _number(polar_meter.get("credited_units")),
            "consumed": _number(polar_meter.get("consumed_units")),
            "balance": _number(polar_meter.get("balance")),
        }
    return {
        "meter_id": meter_id,
        "customer": customer.tag,
        "reducer_id": reducer.id,
        "aggregation": func,
        "local": local,
        "buckets": buckets,
        "pending_events": pending,
        "holds": holds,
        "unreadable_fields": problems + list(state.problems),
        "polar": polar,
        "difference": explain(func, balance.consumed, balance.credited, events, polar),
    }


def explain(
    func: str,
    local_consumed: float,
    local_credited: float,
    events: list[PendingEvent],
    polar: Mapping[str, float | None] | None,
) -> dict[str, Any]:
    """Why the local numbers differ from Polar's, in a sentence and the events behind it."""
    undelivered = [e for e in events if e.acknowledged_us is None]
    acknowledged = [e for e in events if e.acknowledged_us is not None]
    if polar is None or polar["consumed"] is None:
        return {"verdict": "unknown", "text": "Polar's customer meter could not be read."}
    consumed = local_consumed - polar["consumed"]
    lines: list[str] = []
    verdict = "same"
    if _same(local_consumed, polar["consumed"]):
        lines.append("Local consumption equals Polar's.")
    elif consumed > 0:
        verdict = "safe"
        lines.append(
            f"Local consumption is {consumed:g} above Polar's (the safe side): it counts events "
            "Polar's meter does not include yet."
        )
        for group, label in ((undelivered, "undelivered"), (undelivered + acknowledged, "pending")):
            if group and _same(_contribution(func, group), consumed):
                lines.append(f"The {len(group)} {label} events account for all of it.")
                break
        else:
            lines.append(
                f"{len(undelivered)} events are undelivered and {len(acknowledged)} acknowledged "
                "but not yet counted by a snapshot."
            )
    else:
        verdict = "above_polar"
        lines.append(
            f"Local consumption is {-consumed:g} BELOW Polar's, so the local balance is above it: "
            "Polar counted events this Redis does not hold (tracked by another path, or under "
            "another customer id form), or a snapshot is not applied yet. The next snapshot that "
            "covers their buckets corrects it."
        )
    if polar["credited"] is not None and not _same(local_credited, polar["credited"]):
        lines.append(
            f"Credits differ (local {local_credited:g}, Polar {polar['credited']:g}): a credit "
            "change Polar has not pushed, or this Redis has not applied, yet."
        )
        if local_credited > polar["credited"]:
            verdict = "above_polar"
    return {
        "verdict": verdict,
        "consumed": consumed,
        "text": " ".join(lines),
        "undelivered": [e.event_id for e in undelivered],
        "acknowledged": [e.event_id for e in acknowledged],
    }


def _contribution(func: str, events: list[PendingEvent]) -> float:
    if func == "count":
        return float(len(events))
    return math.fsum(e.value for e in events)


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def _aggregate(aggregate: Aggregate) -> dict[str, float | None]:
    return {
        "count": aggregate.count,
        "sum": aggregate.sum,
        "min": aggregate.min,
        "max": aggregate.max,
    }


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _iso(us: int) -> str:
    try:
        return from_us(us).isoformat()
    except (OverflowError, ValueError):  # a bucket start past year 9999: garbage in Redis
        return str(us)
