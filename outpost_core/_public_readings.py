"""Polar's customer meters as its public API reports them, read from a `customer.state_changed`
webhook body (with, per meter, the start of the period of the active subscription that carries
it: where its window began) or a `GET /v1/customer-meters/` page.

Each row becomes a :class:`PolarReading`. Whatever the peer sent, nothing here raises: a body
that is not JSON, or a row with a missing or mistyped field, becomes a :class:`ReadingRejected`
the caller counts and logs, and the other rows are kept.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs

from ._time import to_us

MAX_BODY_BYTES = 8 * 1024 * 1024
"""A webhook or page body above this is refused unread."""


@attrs.frozen(slots=True)
class PolarReading:
    """One customer meter as Polar reported it."""

    external_customer_id: str | None
    customer_id: str | None
    meter_id: str
    consumed: float
    credited: int
    balance: float
    modified_at_us: int | None
    """Polar's ``modified_at``: null until the row's first update; moved by every recompute,
    and once, without a recompute, when the row is activated."""
    reset_at_us: int | None = None
    """When the meter's current window began, where Polar says so: the ``current_period_start``
    of the customer's active subscription that carries the meter (a cycle resets its meters)."""


@attrs.frozen(slots=True)
class ReadingRejected:
    reason: str


Parsed = tuple[list[PolarReading], list[ReadingRejected]]


def _load(body: bytes) -> object | ReadingRejected:
    if len(body) > MAX_BODY_BYTES:
        return ReadingRejected(f"body of {len(body)} bytes is over {MAX_BODY_BYTES}")
    try:
        loaded: object = json.loads(body)
    except (ValueError, RecursionError) as exc:  # not UTF-8 or JSON; too deep; too long a number
        return ReadingRejected(f"not JSON: {type(exc).__name__}")
    return loaded


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _instant(value: object, name: str = "modified_at") -> int | ReadingRejected | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return ReadingRejected(f"{name} is not a string")
    try:
        return to_us(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except ValueError:
        return ReadingRejected(f"{name} {value[:40]!r} is not an ISO instant with a zone")


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def reading_of(
    row: object, external_customer_id: str | None, customer_id: str | None
) -> PolarReading | ReadingRejected:
    """One meter row (`active_meters[]` of a webhook, or a customer-meters item)."""
    if not isinstance(row, Mapping):
        return ReadingRejected("a meter row is not an object")
    meter_id = _text(row.get("meter_id"))
    consumed = _number(row.get("consumed_units"))
    credited = _number(row.get("credited_units"))
    balance = _number(row.get("balance"))
    modified = _instant(row.get("modified_at"))
    if meter_id is None:
        return ReadingRejected("meter_id is missing or not a string")
    if consumed is None or credited is None or balance is None:
        return ReadingRejected(f"meter {meter_id}: a figure is missing or not a finite number")
    if credited != int(credited):
        return ReadingRejected(f"meter {meter_id}: credited_units is not whole")
    if isinstance(modified, ReadingRejected):
        return modified
    if external_customer_id is None and customer_id is None:
        return ReadingRejected(f"meter {meter_id}: no customer id")
    return PolarReading(
        external_customer_id, customer_id, meter_id, consumed, int(credited), balance, modified
    )


def parse_state_changed(body: bytes) -> Parsed:
    """The readings of a ``customer.state_changed`` webhook body; other types give none."""
    data = _load(body)
    if isinstance(data, ReadingRejected):
        return [], [data]
    if not isinstance(data, Mapping) or data.get("type") != "customer.state_changed":
        return [], []
    state = data.get("data")
    meters = state.get("active_meters") if isinstance(state, Mapping) else None
    if not isinstance(state, Mapping) or not isinstance(meters, list):
        return [], [ReadingRejected("customer.state_changed without data.active_meters")]
    readings, rejected = _rows(meters, _text(state.get("external_id")), _text(state.get("id")))
    starts = _period_starts(state.get("active_subscriptions"), rejected)
    return [attrs.evolve(r, reset_at_us=starts.get(r.meter_id)) for r in readings], rejected


def _period_starts(subscriptions: object, rejected: list[ReadingRejected]) -> dict[str, int]:
    """Meter id → the latest ``current_period_start`` of the active subscriptions carrying it
    (``meters[].meter_id``); a subscription that does not read is a rejection, never an error."""
    starts: dict[str, int] = {}
    for subscription in subscriptions if isinstance(subscriptions, list) else ():
        start = None
        meters = None
        if isinstance(subscription, Mapping):
            start = _instant(subscription.get("current_period_start"), "current_period_start")
            meters = subscription.get("meters")
        if not isinstance(start, int) or not isinstance(meters, list):
            rejected.append(ReadingRejected("a subscription without its period start or meters"))
            continue
        for meter in meters:
            meter_id = _text(meter.get("meter_id")) if isinstance(meter, Mapping) else None
            if meter_id is not None:
                starts[meter_id] = max(start, starts.get(meter_id, start))
    return starts


def parse_customer_meters(body: bytes) -> Parsed:
    """The readings of a ``GET /v1/customer-meters/`` page."""
    data = _load(body)
    if isinstance(data, ReadingRejected):
        return [], [data]
    items = data.get("items") if isinstance(data, Mapping) else None
    if not isinstance(items, list):
        return [], [ReadingRejected("a customer-meters page without items")]
    readings: list[PolarReading] = []
    rejected: list[ReadingRejected] = []
    for item in items:
        customer: Any = item.get("customer") if isinstance(item, Mapping) else None
        external = _text(customer.get("external_id")) if isinstance(customer, Mapping) else None
        if external is None and isinstance(item, Mapping):
            external = _text(item.get("external_customer_id"))
        customer_id = _text(item.get("customer_id")) if isinstance(item, Mapping) else None
        found, bad = _rows([item], external, customer_id)
        readings += found
        rejected += bad
    return readings, rejected


def _rows(rows: list[object], external: str | None, customer_id: str | None) -> Parsed:
    readings: list[PolarReading] = []
    rejected: list[ReadingRejected] = []
    for row in rows:
        outcome = reading_of(row, external, customer_id)
        if isinstance(outcome, ReadingRejected):
            rejected.append(outcome)
        else:
            readings.append(outcome)
    return readings, rejected
