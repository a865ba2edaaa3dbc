"""A small reference model of Polar, for the model test, and its side of the WebSocket.

Polar here is what docs/protocol.md promises, nothing more:

* it **stores** each event once (``external_id`` de-duplication), at the wall-clock moment a
  delivery reaches it; an event whose bucket is already synced lands in Postgres at once (a late
  event: counted now), the others wait for their bucket's sync;
* a **sync** moves ``synced_until`` (every bucket ending at or before it is in Postgres) and counts
  the events waiting in those buckets; each counting bumps ``version``;
* it **counts every event it stored within 50 minutes** (:data:`COUNT_WITHIN_US`): a snapshot
  computed more than 50 minutes after it stored an event counts it, one computed exactly 50
  minutes after need not. That is the latest the SDK's one-hour pending limit allows: an
  acknowledged event leaves pending at a snapshot applied more than an hour after its
  acknowledgement, and such a snapshot was computed at most ten minutes before it is applied.
  :meth:`Polar.sync_overdue` keeps that promise as late as it can;
* ``cold_until`` is ``synced_until`` (never later than the current bucket), and at least
  ``floor(now) - 1 h``;
* a **snapshot** is computed at one moment (``as_of``): for each reducer, every counted event of the
  customer in a bucket before ``cold_until``; it is kept, frozen, so that the ``counted`` question
  is answered from the same state for ten minutes (``snapshot_expired`` after that).

The test decides when each of these happens; this module only keeps the books.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Ping,
    Request,
    TextMessage,
)

from outpost_core import BUCKET_US, Aggregate, floor_bucket

MINUTE_US = 60_000_000
HOUR_US = 60 * MINUTE_US
SNAPSHOT_TTL_US = 10 * MINUTE_US
PENDING_LIMIT_US = HOUR_US
"""The SDK's limit (``Settings.pending_limit_us``): an acknowledged event no snapshot counted stays
pending this long after its acknowledgement, and not one microsecond longer."""
COUNT_WITHIN_US = PENDING_LIMIT_US - SNAPSHOT_TTL_US
"""Polar counts an event it stored within this long (strictly: any snapshot computed later
counts it)."""

Json = Any


@attrs.define
class Event:
    """An event as the merchant tracked it, and what Polar will make of it."""

    event_id: str
    customer: str
    timestamp_us: int
    tokens: float | None
    bad: bool
    """Polar refuses it (422) whenever it is sent; the SDK cannot tell (e.g. a deleted customer)."""

    @property
    def bucket(self) -> int:
        return floor_bucket(self.timestamp_us)


@attrs.define
class Stored:
    event: Event
    stored_at: int
    counted_version: int | None = None


@attrs.frozen
class Reducer:
    id: str
    meter_id: str
    func: str

    def value(self, event: Event) -> float | None:
        if self.func == "count":
            return 1.0
        return event.tokens


@attrs.frozen
class Kept:
    """A snapshot as Polar froze it: the payload sent, and the state ``counted`` answers from."""

    payload: Mapping[str, Json]
    customer: str
    as_of: int
    cold_until: int
    version: int


class Polar:
    def __init__(self, now: int, reducers: tuple[Reducer, ...], customers: tuple[str, ...]) -> None:
        self.now = now
        self.reducers = reducers
        self.synced_until = floor_bucket(now)
        self.version = 0
        self.stored: dict[str, Stored] = {}
        self.kept: dict[str, Kept] = {}
        self.credits = {c: {r.meter_id: 100.0 for r in reducers} for c in customers}
        self._next_snapshot = 1

    # -- ingestion ----------------------------------------------------------------------------

    def store(self, event: Event) -> bool:
        """Store one event (``False``: a duplicate, nothing stored)."""
        if event.event_id in self.stored:
            return False
        stored = self.stored[event.event_id] = Stored(event, self.now)
        if event.bucket + BUCKET_US <= self.synced_until:
            self._count(stored)  # a late event lands in its closed bucket in Postgres at once
        return True

    def sync(self, until: int) -> None:
        """Every bucket ending at or before ``until`` (a boundary, not after now) is synced."""
        until = min(until, floor_bucket(self.now))
        if until <= self.synced_until:
            return
        self.synced_until = until
        for stored in self.stored.values():
            if stored.counted_version is None and stored.event.bucket + BUCKET_US <= until:
                self._count(stored)

    def sync_overdue(self) -> None:
        """Sync as little as Polar's promise allows: the buckets of the events stored more than
        :data:`COUNT_WITHIN_US` ago (and every bucket before them)."""
        due = [
            s.event.bucket
            for s in self.stored.values()
            if s.counted_version is None and self.now - s.stored_at > COUNT_WITHIN_US
        ]
        if due:
            self.sync(max(due) + BUCKET_US)

    def deadlines(self) -> list[int]:
        """The moments when Polar's promises bite: the last moment each stored event may still be
        uncounted, and the last moment each kept snapshot can still be asked about."""
        out = [
            s.stored_at + COUNT_WITHIN_US for s in self.stored.values() if s.counted_version is None
        ]
        return out + [kept.as_of + SNAPSHOT_TTL_US for kept in self.kept.values()]

    def _count(self, stored: Stored) -> None:
        self.version += 1
        stored.counted_version = self.version

    # -- snapshots ----------------------------------------------------------------------------

    def cold_until(self) -> int:
        current = floor_bucket(self.now)
        return max(current - HOUR_US, min(self.synced_until, current))

    def snapshot(self, customer: str, request_id: str | None) -> Mapping[str, Json]:
        cold = self.cold_until()
        snapshot_id = f"s-{self._next_snapshot}"
        self._next_snapshot += 1
        counted = [
            s.event
            for s in self.stored.values()
            if s.event.customer == customer
            and s.counted_version is not None
            and s.event.bucket < cold
        ]
        reducers = {r.id: wire(aggregate(r, counted)) for r in self.reducers}
        payload = {
            "request_id": request_id,
            "snapshot_id": snapshot_id,
            "external_customer_id": customer,
            "as_of": self.now,
            "cold_until": cold,
            "reducers": reducers,
            "credited": dict(self.credits[customer]),
        }
        self.kept[snapshot_id] = Kept(payload, customer, self.now, cold, self.version)
        return payload

    def counted(self, snapshot_id: str, event_ids: list[str]) -> list[str] | None:
        """The asked ids the snapshot counts, or ``None`` when it expired (or never existed)."""
        kept = self.kept.get(snapshot_id)
        if kept is None or self.now - kept.as_of > SNAPSHOT_TTL_US:
            return None
        return [i for i in dict.fromkeys(event_ids) if self.counts(kept, i)]

    def counts(self, kept: Kept, event_id: str) -> bool:
        """Whether the snapshot's totals include the event."""
        stored = self.stored.get(event_id)
        return (
            stored is not None
            and stored.event.customer == kept.customer
            and stored.event.bucket < kept.cold_until
            and stored.counted_version is not None
            and stored.counted_version <= kept.version
        )

    # -- what the invariants compare with -----------------------------------------------------

    def eventual(self, customer: str, reducer: Reducer) -> Aggregate:
        """Polar's consumption once everything it stored is counted (every bucket synced)."""
        events = [s.event for s in self.stored.values() if s.event.customer == customer]
        return aggregate(reducer, events)


def aggregate(reducer: Reducer, events: list[Event]) -> Aggregate:
    total = Aggregate()
    for event in events:
        value = reducer.value(event)
        if value is not None:
            total = total.add(value)
    return total


def wire(agg: Aggregate) -> Json:
    return {"count": agg.count, "sum": agg.sum, "min": agg.min, "max": agg.max}


class PolarSocket:
    """Polar's end of one WebSocket connection (wsproto server), answering with ``answer``."""

    def __init__(self, answer: Callable[[Json], list[Json]]) -> None:
        self._ws = WSConnection(ConnectionType.SERVER)
        self._answer = answer
        self._partial: list[str] = []
        self.closed = False

    def receive(self, data: bytes) -> bytes:
        """Bytes from the client; returns the bytes Polar sends back."""
        self._ws.receive_data(data)
        out = bytearray()
        for event in self._ws.events():
            if isinstance(event, Request):
                out += self._ws.send(AcceptConnection())
            elif isinstance(event, TextMessage):
                self._partial.append(event.data)
                if event.message_finished:
                    message = json.loads("".join(self._partial))
                    self._partial = []
                    for reply in self._answer(message):
                        out += self.send(reply)
            elif isinstance(event, Ping):
                out += self._ws.send(event.response())
            elif isinstance(event, CloseConnection):
                self.closed = True
        return bytes(out)

    def send(self, message: Json) -> bytes:
        return self._ws.send(TextMessage(data=json.dumps(message)))
