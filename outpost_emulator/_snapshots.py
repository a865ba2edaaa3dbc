"""Snapshots: one customer's totals, frozen so that `counted` can be answered from them later.

A snapshot reads, at `as_of`, every bucket row before `cold_until` (all generations), and the
credits. Its `counted` answer uses the same state: an id is counted iff the customer has a
stored event with that external_id, in a bucket before `cold_until`, that was already counted
when the snapshot was taken (its counted version <= the snapshot's version; with a running
clock that is counted_at <= as_of).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from outpost_emulator._customers import CustomerKey
from outpost_emulator._model import Identity, JsonObject
from outpost_emulator._timeutil import MINUTE_US

if TYPE_CHECKING:
    from outpost_emulator._state import Hub

SNAPSHOT_TTL_US = 10 * MINUTE_US  # "answerable for at least 10 minutes" (protocol §1.2)
MAX_KEPT = 100_000  # bound memory when the clock is frozen and pushes pile up


@dataclass(frozen=True, slots=True)
class FrozenSnapshot:
    id: str
    customer: CustomerKey
    identities: frozenset[Identity]
    as_of_us: int
    cold_until_us: int
    version: int


class Snapshots:
    def __init__(self) -> None:
        self._kept: OrderedDict[str, FrozenSnapshot] = OrderedDict()
        self._next = 1
        self.expired_answers = 0

    def record(
        self,
        customer: CustomerKey,
        identities: frozenset[Identity],
        as_of: int,
        cold: int,
        version: int,
    ) -> FrozenSnapshot:
        snapshot = FrozenSnapshot(f"s-{self._next}", customer, identities, as_of, cold, version)
        self._next += 1
        self._kept[snapshot.id] = snapshot
        while len(self._kept) > MAX_KEPT:
            self._kept.popitem(last=False)
        return snapshot

    def get(self, snapshot_id: str, now_us: int) -> FrozenSnapshot | None:
        snapshot = self._kept.get(snapshot_id)
        if snapshot is None or now_us - snapshot.as_of_us > SNAPSHOT_TTL_US:
            return None
        return snapshot

    def prune(self, now_us: int) -> None:
        while self._kept:
            oldest = next(iter(self._kept.values()))
            if now_us - oldest.as_of_us <= SNAPSHOT_TTL_US:
                break
            self._kept.popitem(last=False)

    def __len__(self) -> int:
        return len(self._kept)


def build_snapshot(
    hub: Hub, identity: Identity, shown_as: str, request_id: str | None
) -> JsonObject | None:
    """The `snapshot` payload for this identity, or None for an unknown customer_id."""
    customer = hub.customers.resolve(identity)
    if customer is None:
        return None
    now = hub.now_us()
    cold = hub.pipeline.cold_until(now)
    identities = frozenset(hub.customers.identities(customer))
    reducers = {
        r.id: hub.pipeline.totals(r.id, identities, cold)
        for r in hub.reducers.values()
        if r.reducible
    }
    credited = {m: hub.credits.credited(identities, m) for m in hub.meters}
    snapshot = hub.snapshots.record(customer, identities, now, cold, hub.pipeline.version)
    # The customer's other reference forms: a client merges what it tracked under them.
    aliases = {kind: value for kind, value in identities if kind != identity[0]}
    return {
        "request_id": request_id,
        "snapshot_id": snapshot.id,
        identity[0]: shown_as,
        "as_of": now,
        "cold_until": cold,
        "reducers": reducers,
        "credited": credited,
        "aliases": aliases,
    }


def counted_ids(hub: Hub, snapshot_id: str, event_ids: list[str]) -> list[str] | None:
    """The asked ids the snapshot counts (asked order, no repeats); None if it expired."""
    snapshot = hub.snapshots.get(snapshot_id, hub.now_us())
    if snapshot is None:
        hub.snapshots.expired_answers += 1
        return None
    found: list[str] = []
    for event_id in dict.fromkeys(event_ids):
        event = hub.event_by_external_id(event_id)
        if (
            event is not None
            and event.identity in snapshot.identities
            and event.bucket_start_us < snapshot.cold_until_us
            and event.counted_version is not None
            and event.counted_version <= snapshot.version
        ):
            found.append(event_id)
    return found
