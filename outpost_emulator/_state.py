"""The emulator's whole state (one organization) and the fan-out of pushes.

Everything here runs on the server's event loop thread, so it needs no locks; the Python API
reaches it through `asyncio.run_coroutine_threadsafe` (see _server.py).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

from outpost_emulator._auth import DEFAULT_SCOPES, Tokens
from outpost_emulator._clock import EmulatorClock
from outpost_emulator._connections import Connections
from outpost_emulator._credits import Credits
from outpost_emulator._customers import CustomerKey, Customers
from outpost_emulator._defaults import DEFAULT_TOKEN
from outpost_emulator._faults import Faults
from outpost_emulator._limits import DEFAULT_REQUESTS_PER_MINUTE, RateLimit
from outpost_emulator._model import Identity, JsonObject, Meter, Reducer, StoredEvent
from outpost_emulator._pipeline import Pipeline
from outpost_emulator._public import (
    DEFAULT_RECOMPUTE_MAX_S,
    DEFAULT_RECOMPUTE_MIN_S,
    PublicMeters,
    update_customer,
)
from outpost_emulator._snapshots import Snapshots, build_snapshot
from outpost_emulator._timeutil import SECOND_US, iso
from outpost_emulator._webhooks import Webhooks
from outpost_emulator._webhooks import run_due as run_webhooks

log = logging.getLogger("outpost_emulator")

# Finds the transport of a client connection (by its address) so a fault can abort it.
TransportFinder = Callable[[tuple[str, int]], asyncio.Transport | None]


class Hub:
    def __init__(
        self,
        *,
        clock: EmulatorClock | None = None,
        token: str = DEFAULT_TOKEN,
        scopes: Iterable[str] = DEFAULT_SCOPES,
        sync_delay: float = 10.0,
        rate_limit: int = DEFAULT_REQUESTS_PER_MINUTE,
        public_only: bool = False,
        recompute_delays: tuple[float, float] = (DEFAULT_RECOMPUTE_MIN_S, DEFAULT_RECOMPUTE_MAX_S),
        replica_lag: float = 0.0,
    ) -> None:
        if not sync_delay >= 0:
            raise ValueError("sync_delay must be >= 0 seconds")
        if not replica_lag >= 0:
            raise ValueError("replica_lag must be >= 0 seconds")
        self.clock = clock or EmulatorClock()
        self.organization_id = str(uuid.uuid4())
        self.tokens = Tokens(token, scopes)
        self.customers = Customers()
        # The indexes below change only through this class's methods, which keep them in step.
        self._meters: dict[str, Meter] = {}
        self._reducers: dict[str, Reducer] = {}
        self._events: list[StoredEvent] = []
        self._by_external_id: dict[str, StoredEvent] = {}
        self._by_identity: dict[Identity, list[StoredEvent]] = {}
        self.pipeline = Pipeline(self.clock.now_us(), round(sync_delay * SECOND_US))
        self.credits = Credits()
        self.snapshots = Snapshots()
        self.faults = Faults()
        self.rate_limit = RateLimit(rate_limit)
        self.connections = Connections()
        self.remote_admin = False
        """Whether the admin API answers requests to a non-loopback host (--allow-remote)."""
        self.counters: Counter[str] = Counter()
        self.telemetry: list[JsonObject] = []
        self.transport_finder: TransportFinder | None = None
        # Polar's public API as it is: no /v1/outpost/, customer meters from stored rows that a
        # debounced job recomputes, customer.state_changed webhooks.
        self.public_only = public_only
        self.public = PublicMeters.create(*recompute_delays)
        self.webhooks = Webhooks()
        self.replica_lag_us = round(replica_lag * SECOND_US)

    def now_us(self) -> int:
        return self.clock.now_us()

    # Indexes (read-only views; change them through the methods below) ----------------------

    @property
    def meters(self) -> Mapping[str, Meter]:
        return MappingProxyType(self._meters)

    @property
    def reducers(self) -> Mapping[str, Reducer]:
        return MappingProxyType(self._reducers)

    @property
    def events(self) -> Sequence[StoredEvent]:
        """Every stored event in arrival order (`seq` is its 1-based position)."""
        return tuple(self._events)

    def active_reducers(self) -> list[Reducer]:
        return list(self._reducers.values())

    def events_of(self, customer: CustomerKey) -> list[StoredEvent]:
        found: list[StoredEvent] = []
        for identity in self.customers.identities(customer):
            found.extend(self._by_identity.get(identity, []))
        return found

    def event_by_external_id(self, external_id: str) -> StoredEvent | None:
        return self._by_external_id.get(external_id)

    def identities_with_events(self) -> list[Identity]:
        return list(self._by_identity)

    def add_meter(self, meter: Meter, reducer: Reducer, now: int) -> None:
        """Register a meter and its reducer, then place every stored event in its buckets."""
        self._meters[meter.id] = meter
        self._reducers[reducer.id] = reducer
        self.pipeline.backfill(reducer, self._events, now)

    def store_event(
        self,
        *,
        name: str,
        timestamp_us: int,
        identity: Identity,
        external_id: str | None,
        metadata: JsonObject,
        now: int,
    ) -> StoredEvent | None:
        """Store one event; None when its `external_id` is already held (a duplicate forever).

        Polar: ON CONFLICT (organization_id, external_id) DO NOTHING.
        """
        if external_id is not None and external_id in self._by_external_id:
            return None
        event = StoredEvent(
            seq=len(self._events) + 1,
            name=name,
            timestamp_us=timestamp_us,
            identity=identity,
            external_id=external_id,
            metadata=metadata,
            ingested_at_us=now,
        )
        self._events.append(event)
        self._by_identity.setdefault(identity, []).append(event)
        if external_id is not None:
            self._by_external_id[external_id] = event
        return event

    # Time ------------------------------------------------------------------------------------

    def tick(self) -> None:
        """Run every sync and seal due by now, then push what they changed."""
        now = self.now_us()
        moved = self.pipeline.run_due(now, self.active_reducers())
        self.snapshots.prune(now)
        if moved:
            self.push_snapshots(moved)
        if self.public_only:
            for at_us, customer in self.public.jobs.due(now):
                if update_customer(self, customer, at_us):
                    self.webhooks.state_changed(customer, at_us)
            run_webhooks(self, now)

    def customer_changed(self, customer: CustomerKey, now: int) -> None:
        """Polar's `customer_meter.update_customer` enqueued for this customer (public API)."""
        if self.public_only:
            self.public.jobs.enqueue(customer, now)

    # Pushes ----------------------------------------------------------------------------------

    def push_snapshots(self, changed: Iterable[Identity]) -> None:
        """A fresh snapshot (request_id null) to every subscription of a changed customer."""
        customers = {self.customers.resolve(i) for i in changed}
        customers.discard(None)
        for connection in self.connections.all():
            for identity, shown_as in list(connection.subscriptions.items()):
                if self.customers.resolve(identity) not in customers:
                    continue
                payload = build_snapshot(self, identity, shown_as, None)
                if payload is not None:
                    self.counters["snapshots_pushed"] += 1
                    log.info("ws#%d -> pushed snapshot %s", connection.id, payload["snapshot_id"])
                    connection.send(
                        {"type": "snapshot", "payload": payload}, self.faults.snapshot_delay_s
                    )

    def configuration_payload(self) -> JsonObject:
        return {
            "organization_id": self.organization_id,
            "meters": [m.to_json() for m in self.meters.values()],
            "reducers": [r.to_json() for r in self.reducers.values()],
        }

    def push_configuration(self) -> None:
        message = {"type": "configuration", "payload": self.configuration_payload()}
        for connection in self.connections.all():
            connection.send(message)

    # Dump ------------------------------------------------------------------------------------

    def state(self) -> JsonObject:
        now = self.now_us()
        statuses = Counter(e.status for e in self._events)
        return {
            "now": iso(now),
            "now_us": now,
            "organization_id": self.organization_id,
            "clock": {"speed": self.clock.speed, "frozen": self.clock.frozen},
            "events": {
                "count": len(self._events),
                "current": statuses["current"],
                "waiting": statuses["waiting"],
                "counted": statuses["counted"],
            },
            "customers": [c.to_json() for c in self.customers.all()],
            "meters": [m.to_json() for m in self.meters.values()],
            "reducers": [r.to_json() for r in self.reducers.values()],
            "pipeline": self.pipeline.to_json(now),
            "cold_until": self.pipeline.cold_until(now),
            "credits": self.credits.to_json(),
            "connections": [c.to_json() for c in self.connections.all()],
            "snapshots_kept": len(self.snapshots),
            "faults": {**self.faults.to_json(), "syncs_paused": self.pipeline.paused},
            "tokens": self.tokens.to_json(),
            "counters": dict(sorted(self.counters.items())),
            "public": self.public_state(),
        }

    def public_state(self) -> JsonObject:
        rows = [
            {
                "customer": list(customer),
                "meter_id": meter_id,
                "activated": row.activated,
                "consumed_units": row.consumed,
                "credited_units": row.credited,
                "modified_at": None if row.modified_at_us is None else iso(row.modified_at_us),
            }
            for (customer, meter_id), row in self.public.rows.items()
        ]
        return {
            "public_only": self.public_only,
            "rows": rows,
            "pending_recomputes": len(self.public.jobs),
            "recomputes": self.public.recomputes,
            "replica_lag_s": self.replica_lag_us / SECOND_US,
            "webhooks": self.webhooks.to_json(),
        }
