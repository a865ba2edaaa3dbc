"""Polar's customer meters as its public API serves them: stored rows, recomputed by a
debounced job, with `modified_at` null until the first update and bumped by activation.

Polar keeps one `customer_meters` row per (customer, meter). Ingestion does not recompute it:
it enqueues a job per customer, debounced (each enqueue delays the newest message by the
minimum threshold and keeps the oldest enqueue time; a message that is not the newest runs
only when the oldest enqueue is older than the maximum threshold). So a row is recomputed
15 s after the last ingest of a burst, and under continuous traffic only every 180 minutes.
Credit grants, revocations and cycles recompute that one meter at once. Ingestion also
activates a not-yet-activated row of a matching meter, which moves its `modified_at` without
recomputing it.

The true figures (what a recompute now would give) come from `true_figures`; the admin API
answers with them, whatever the rows say.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from outpost_emulator._customers import CustomerKey
from outpost_emulator._debounce import Debouncer
from outpost_emulator._matching import consumed, sql_matches
from outpost_emulator._model import Meter, StoredEvent
from outpost_emulator._timeutil import SECOND_US

if TYPE_CHECKING:
    from outpost_emulator._state import Hub

DEFAULT_RECOMPUTE_MIN_S = 15.0  # Polar's CUSTOMER_METER_UPDATE_DEBOUNCE_MIN_THRESHOLD
DEFAULT_RECOMPUTE_MAX_S = 180 * 60.0  # ..._MAX_THRESHOLD

RowKey = tuple[CustomerKey, str]  # (customer, meter id)


@dataclass(frozen=True, slots=True)
class Reset:
    """A `meter.reset`: events ingested at or after `at_us` count; credits after `credit_seq`."""

    at_us: int
    credit_seq: int  # credits with a seq >= this one are in the new window


@dataclass(slots=True)
class Row:
    created_at_us: int
    activated: bool
    consumed: float = 0.0
    credited: int = 0
    modified_at_us: int | None = None  # set by an UPDATE only, as Polar's TimestampedModel
    balanced: tuple[int, ...] | None = None  # what the last recompute saw (last_balanced_event)


@dataclass(slots=True)
class PublicMeters:
    """The stored rows, the resets and the pending recompute jobs."""

    jobs: Debouncer[CustomerKey]
    rows: dict[RowKey, Row] = field(default_factory=dict)
    resets: dict[RowKey, Reset] = field(default_factory=dict)
    recomputes: int = 0

    @classmethod
    def create(cls, min_s: float, max_s: float) -> PublicMeters:
        if not 0 <= min_s <= max_s:
            raise ValueError("the recompute delays need 0 <= minimum <= maximum")
        return cls(Debouncer(round(min_s * SECOND_US), round(max_s * SECOND_US)))


def claim(meters: PublicMeters, external_id: str, customer_id: str) -> None:
    """A customer created with an external id takes over the rows and resets its events had."""
    old: CustomerKey = ("external", external_id)
    new: CustomerKey = ("customer", customer_id)
    for table in (meters.rows, meters.resets):
        for key in [k for k in table if k[0] == old]:
            table.setdefault((new, key[1]), table.pop(key))  # type: ignore[arg-type]


def window_events(hub: Hub, customer: CustomerKey, meter: Meter) -> list[StoredEvent]:
    """The customer's user events in the meter's current window (ingested since the reset)."""
    reset = hub.public.resets.get((customer, meter.id))
    events = hub.events_of(customer)
    if reset is None:
        return events
    return [e for e in events if e.ingested_at_us >= reset.at_us]


def _credit_floor(hub: Hub, customer: CustomerKey, meter_id: str) -> int:
    reset = hub.public.resets.get((customer, meter_id))
    return 0 if reset is None else reset.credit_seq


def true_figures(hub: Hub, customer: CustomerKey, meter: Meter) -> tuple[float, int]:
    """(consumed, credited) as a recompute now would find them."""
    used = consumed(meter.filter, meter.aggregation, window_events(hub, customer, meter))
    identities = hub.customers.identities(customer)
    floor = _credit_floor(hub, customer, meter.id)
    return used, hub.credits.credited(identities, meter.id, since_seq=floor)


def _newest(hub: Hub, customer: CustomerKey, meter: Meter) -> tuple[int, ...] | None:
    """What identifies the newest event of the window (user or credit), or None."""
    matching = [e.seq for e in window_events(hub, customer, meter) if sql_matches(meter.filter, e)]
    floor = _credit_floor(hub, customer, meter.id)
    credits = hub.credits.seqs(hub.customers.identities(customer), meter.id, since_seq=floor)
    if not matching and not credits:
        return None
    return (len(matching), max(matching, default=0), len(credits), max(credits, default=-1))


def update_customer_meter(
    hub: Hub, customer: CustomerKey, meter: Meter, now_us: int, *, activate: bool = False
) -> bool:
    """Polar's `update_customer_meter`: True when the row was recomputed."""
    key = (customer, meter.id)
    row = hub.public.rows.get(key)
    if row is not None and not row.activated:
        if not activate:
            return False
        row.activated = True
        row.modified_at_us = now_us  # setting activated_at is an UPDATE
    newest = _newest(hub, customer, meter)
    if row is None:
        row = Row(created_at_us=now_us, activated=newest is not None or activate)
        hub.public.rows[key] = row
    if newest is None or row.balanced == newest:
        return False
    row.consumed, row.credited = true_figures(hub, customer, meter)
    row.balanced = newest
    row.modified_at_us = now_us
    hub.public.recomputes += 1
    return True


def update_customer(hub: Hub, customer: CustomerKey, now_us: int) -> bool:
    """Polar's `update_customer`: every meter of the organization; True when a row changed."""
    changed = False
    for meter in hub.meters.values():
        changed = update_customer_meter(hub, customer, meter, now_us) or changed
    return changed


def activate_matching(hub: Hub, events: Iterable[StoredEvent], now_us: int) -> None:
    """Ingestion's activation of not-yet-activated rows of matching meters: `modified_at` moves,
    nothing is recomputed."""
    for event in events:
        customer = hub.customers.resolve(event.identity)
        if customer is None:
            continue
        for meter in hub.meters.values():
            row = hub.public.rows.get((customer, meter.id))
            if row is not None and not row.activated and sql_matches(meter.filter, event):
                row.activated = True
                row.modified_at_us = now_us


def row_item_figures(row: Row) -> tuple[float, int, float]:
    """(consumed, credited, balance) as the row holds them."""
    return row.consumed, row.credited, row.credited - row.consumed
