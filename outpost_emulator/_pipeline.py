"""Polar's reducer-bucket pipeline: the Redis current bucket, syncs, late events, seals.

Every stored event goes one of three ways at ingest, as in Polar's pipeline:

- its bucket is the current one: it waits in "Redis" and is not counted until the close-sync,
  which runs `sync_delay` after the bucket ends and moves it into its "Postgres" row;
- its bucket is closed: it lands in its Postgres row at once (a late event), unless syncs are
  paused, in which case it waits for the resume;
- either way, once in a row it is *counted*, stamped with the time and the emulator's version.

A row is (reducer, customer reference, bucket, generation). Rows are sealed 11 minutes after
their bucket ends, once the bucket is synced and nothing of it waits; an event that lands in a
sealed row starts the next generation. All generations count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from outpost_emulator._matching import contribution
from outpost_emulator._model import Identity, JsonObject, Reducer, StoredEvent
from outpost_emulator._timeutil import BUCKET_US, LOOKBACK_US, SEAL_AFTER_US, floor_bucket, iso


def aggregate(values: list[float]) -> JsonObject:
    """The protocol's aggregate: {count, sum, min, max}, min/max null when empty."""
    if not values:
        return {"count": 0, "sum": 0.0, "min": None, "max": None}
    return {"count": len(values), "sum": math.fsum(values), "min": min(values), "max": max(values)}


@dataclass(slots=True)
class Row:
    reducer_id: str
    identity: Identity
    bucket_start_us: int
    generation: int
    created_at_us: int
    sealed_at_us: int | None = None
    # (event seq, external_id, value) of every event this row counts.
    entries: list[tuple[int, str | None, float]] = field(default_factory=list)

    def to_json(self) -> JsonObject:
        kind, value = self.identity
        return {
            "reducer_id": self.reducer_id,
            kind: value,
            "bucket_start": self.bucket_start_us,
            "bucket_start_iso": iso(self.bucket_start_us),
            "generation": self.generation,
            "sealed": self.sealed_at_us is not None,
            "sealed_at": self.sealed_at_us,
            "counted": aggregate([v for _, _, v in self.entries]),
            "event_ids": [e for _, e, _ in self.entries],
        }


class Pipeline:
    def __init__(self, now_us: int, sync_delay_us: int) -> None:
        self.sync_delay_us = sync_delay_us
        # Watermarks: every bucket ending at or before them has had its close-sync / its seal.
        # Buckets before the emulator started were empty, so they count as done.
        self.synced_until_us = floor_bucket(now_us - sync_delay_us)
        self.sealed_until_us = min(floor_bucket(now_us - SEAL_AFTER_US), self.synced_until_us)
        self.paused = False
        self.resumed_at_us = 0
        self.version = 0  # bumped each time an event becomes counted
        self.current: dict[int, list[StoredEvent]] = {}  # bucket -> events in "Redis"
        self.waiting: dict[int, list[StoredEvent]] = {}  # bucket -> late events held by a pause
        self.rows: dict[tuple[str, Identity], dict[int, list[Row]]] = {}
        self.unsealed: dict[int, list[Row]] = {}  # bucket -> rows the seal has not passed yet
        self.syncs_run = 0

    # Ingest ----------------------------------------------------------------------------------

    def place(self, event: StoredEvent, reducers: Iterable[Reducer], now_us: int) -> bool:
        """Route a newly stored event; True when it was counted now (a late event)."""
        bucket = event.bucket_start_us
        if bucket >= floor_bucket(now_us) and bucket + BUCKET_US > self.synced_until_us:
            event.status = "current"
            self.current.setdefault(bucket, []).append(event)
            return False
        if self.paused:
            event.status = "waiting"
            self.waiting.setdefault(bucket, []).append(event)
            return False
        self._count(event, reducers, now_us)
        return True

    def backfill(self, reducer: Reducer, events: Iterable[StoredEvent], now_us: int) -> None:
        """A new reducer sees every event already counted (so `counted` stays true for it)."""
        for event in events:
            if event.status == "counted":
                self._add(reducer, event, now_us)

    # Time-driven work ------------------------------------------------------------------------

    def run_due(self, now_us: int, reducers: list[Reducer]) -> set[Identity]:
        """Run the syncs and seals due at `now_us`; returns the references whose data moved."""
        moved: set[Identity] = set()
        if not self.paused:
            due_end = floor_bucket(now_us - self.sync_delay_us)
            if due_end > self.synced_until_us:
                for bucket in sorted(b for b in self.current if b + BUCKET_US <= due_end):
                    at = max(bucket + BUCKET_US + self.sync_delay_us, self.resumed_at_us)
                    for event in self.current.pop(bucket):
                        self._count(event, reducers, min(at, now_us))
                        moved.add(event.identity)
                    self.syncs_run += 1
                self.synced_until_us = due_end
        self._seal(now_us)
        return moved

    def pause(self) -> None:
        self.paused = True

    def resume(self, now_us: int, reducers: list[Reducer]) -> set[Identity]:
        if not self.paused:
            return set()
        self.paused = False
        self.resumed_at_us = now_us
        moved: set[Identity] = set()
        for bucket in sorted(self.waiting):
            for event in self.waiting.pop(bucket):
                self._count(event, reducers, now_us)
                moved.add(event.identity)
        return moved | self.run_due(now_us, reducers)

    def _seal(self, now_us: int) -> None:
        limit = min(floor_bucket(now_us - SEAL_AFTER_US), self.synced_until_us)
        if self.waiting:
            limit = min(limit, min(self.waiting))  # a bucket seals once all its events arrived
        if limit <= self.sealed_until_us:
            return
        for bucket in sorted(b for b in self.unsealed if b + BUCKET_US <= limit):
            at = min(now_us, max(bucket + BUCKET_US + SEAL_AFTER_US, self.resumed_at_us))
            for row in self.unsealed.pop(bucket):
                row.sealed_at_us = at
        self.sealed_until_us = limit

    # Reading ---------------------------------------------------------------------------------

    def cold_until(self, now_us: int) -> int:
        """End of the newest bucket such that it and every bucket of the last hour before it
        had its close-sync and holds no waiting event; never earlier than floor(now) - 1 h."""
        current = floor_bucket(now_us)
        end = min(self.synced_until_us, current)
        if self.waiting:
            end = min(end, min(self.waiting))
        return max(current - LOOKBACK_US, end)

    def totals(self, reducer_id: str, identities: Iterable[Identity], before_us: int) -> JsonObject:
        """Aggregate of every row generation of these references in buckets before `before_us`."""
        values: list[float] = []
        for identity in identities:
            for bucket, generations in self.rows.get((reducer_id, identity), {}).items():
                if bucket < before_us:
                    for row in generations:
                        values.extend(v for _, _, v in row.entries)
        return aggregate(values)

    def all_rows(self) -> list[Row]:
        return [r for by_bucket in self.rows.values() for gens in by_bucket.values() for r in gens]

    # Internals -------------------------------------------------------------------------------

    def _count(self, event: StoredEvent, reducers: Iterable[Reducer], at_us: int) -> None:
        self.version += 1
        event.status = "counted"
        event.counted_at_us = at_us
        event.counted_version = self.version
        for reducer in reducers:
            self._add(reducer, event, at_us)

    def _add(self, reducer: Reducer, event: StoredEvent, at_us: int) -> None:
        if not reducer.reducible:
            return
        value = contribution(reducer.filter, reducer.aggregation, event)
        if value is None:
            return
        bucket = event.bucket_start_us
        generations = self.rows.setdefault((reducer.id, event.identity), {}).setdefault(bucket, [])
        if not generations or generations[-1].sealed_at_us is not None:
            generation = generations[-1].generation + 1 if generations else 1
            row = Row(reducer.id, event.identity, bucket, generation, at_us)
            generations.append(row)
            # A row opened after its bucket's seal stays open (the next billing run's business).
            if bucket + BUCKET_US > self.sealed_until_us:
                self.unsealed.setdefault(bucket, []).append(row)
        generations[-1].entries.append((event.seq, event.external_id, value))

    def to_json(self, now_us: int) -> JsonObject:
        return {
            "sync_delay_s": self.sync_delay_us / 1_000_000,
            "syncs_paused": self.paused,
            "synced_until": self.synced_until_us,
            "sealed_until": self.sealed_until_us,
            "cold_until": self.cold_until(now_us),
            "close_syncs_run": self.syncs_run,
            "current_buckets": {
                str(b): [e.external_id for e in evs] for b, evs in sorted(self.current.items())
            },
            "waiting_buckets": {
                str(b): [e.external_id for e in evs] for b, evs in sorted(self.waiting.items())
            },
            "rows": [r.to_json() for r in self.all_rows()],
        }
