"""What the dashboard shows, read from the hub in one pass: `GET /__emulator/summary`.

Read-only. It runs on the server loop like every request, so it is bounded: one pass over the
stored events, and balances for the most recently active customers only (each balance reads
every event of its customer).
"""

from __future__ import annotations

from collections import Counter

from outpost_emulator._customers import CustomerKey
from outpost_emulator._meters import customer_meter_item
from outpost_emulator._model import EventStatus, Identity, IdentityField, JsonObject, Meter
from outpost_emulator._state import Hub
from outpost_emulator._timeutil import BUCKET_US, MINUTE_US, SEAL_AFTER_US, floor_bucket, iso

MINUTES_SHOWN = 15  # events ingested per minute, over this many minutes of the emulator's clock
BUCKETS_SHOWN = 12  # the newest buckets that hold events, and the current one
CUSTOMERS_SHOWN = 50  # the most recently active customers get their balances computed


def dashboard_summary(hub: Hub) -> JsonObject:
    now = hub.now_us()
    minute_now = now - now % MINUTE_US
    first_minute = minute_now - (MINUTES_SHOWN - 1) * MINUTE_US
    per_minute: Counter[int] = Counter()
    in_bucket: Counter[tuple[int, EventStatus]] = Counter()  # (bucket start, status) -> events
    # Each reference's latest activity: (emulator time, event seq), so that same-instant ties
    # go to the event that arrived last. Events come in arrival order: the last one wins.
    latest: dict[Identity, tuple[int, int]] = {}
    for event in hub.events:
        at = event.ingested_at_us
        if first_minute <= at < minute_now + MINUTE_US:
            per_minute[at - at % MINUTE_US] += 1
        in_bucket[event.timestamp_us - event.timestamp_us % BUCKET_US, event.status] += 1
        latest[event.identity] = (at, event.seq)
    for credit in hub.credits.to_json():
        kind: IdentityField = "customer_id" if "customer_id" in credit else "external_customer_id"
        identity: Identity = (kind, credit[kind])
        latest[identity] = max(latest.get(identity, (0, 0)), (credit["at"], 0))
    last_active: dict[CustomerKey, tuple[int, int]] = {}
    for identity, stamp in latest.items():
        key = hub.customers.resolve(identity)
        if key is not None:
            last_active[key] = max(last_active.get(key, (0, 0)), stamp)
    for customer in hub.customers.all():
        last_active.setdefault(("customer", customer.id), (customer.created_at_us, 0))
    statuses: Counter[EventStatus] = Counter()
    for (_, status), count in in_bucket.items():
        statuses[status] += count
    return {
        "now": iso(now),
        "now_us": now,
        "clock": {"speed": hub.clock.speed, "frozen": hub.clock.frozen},
        "sync_delay_s": hub.pipeline.sync_delay_us / 1_000_000,
        "events": {
            "count": sum(statuses.values()),
            "current": statuses["current"],
            "waiting": statuses["waiting"],
            "counted": statuses["counted"],
        },
        "ingest_per_minute": [
            {"minute": iso(m), "events": per_minute[m]}
            for m in range(first_minute, minute_now + MINUTE_US, MINUTE_US)
        ],
        "meters": [_meter(m) for m in hub.meters.values()],
        "customers": _customers(hub, last_active),
        "customers_total": len(last_active),
        "buckets": _buckets(hub, in_bucket, now),
        "connections": [c.to_json() for c in hub.connections.all()],
        "faults": {**hub.faults.to_json(), "syncs_paused": hub.pipeline.paused},
        "counters": {
            "close_syncs_run": hub.pipeline.syncs_run,
            "snapshots_pushed": hub.counters["snapshots_pushed"],
        },
        "cold_until": iso(hub.pipeline.cold_until(now)),
    }


def _meter(meter: Meter) -> JsonObject:
    return {
        "id": meter.id,
        "name": meter.name,
        "aggregation": meter.aggregation.to_json(),
        "filter": meter.filter.to_json(),
    }


def _customers(hub: Hub, last_active: dict[CustomerKey, tuple[int, int]]) -> list[JsonObject]:
    """The most recently active customers, listed by name so that rows keep their places."""
    newest = sorted(last_active, key=lambda k: last_active[k], reverse=True)[:CUSTOMERS_SHOWN]
    newest.sort(key=lambda k: tuple(v or "" for v in reversed(hub.customers.describe(k))))
    shown = []
    for key in newest:
        customer_id, external_id = hub.customers.describe(key)
        meters = []
        for meter in hub.meters.values():
            item = customer_meter_item(hub, key, meter)
            meters.append(
                {
                    "meter_id": meter.id,
                    "consumed_units": item["consumed_units"],
                    "credited_units": item["credited_units"],
                    "balance": item["balance"],
                }
            )
        shown.append(
            {
                "customer_id": customer_id,
                "external_id": external_id,
                "last_active": iso(last_active[key][0]),
                "meters": meters,
            }
        )
    return shown


def _buckets(hub: Hub, in_bucket: Counter[tuple[int, EventStatus]], now: int) -> list[JsonObject]:
    """The newest buckets with events (and the current one), each with the step it has
    reached on the emulator's clock: open, closed (its close-sync not run yet), synced, sealed."""
    pipeline = hub.pipeline
    starts = {start for start, _ in in_bucket} | {floor_bucket(now)}
    generations: dict[int, int] = {}
    for row in pipeline.all_rows():
        generations[row.bucket_start_us] = max(
            generations.get(row.bucket_start_us, 0), row.generation
        )
    shown = []
    for start in sorted(starts, reverse=True)[:BUCKETS_SHOWN]:
        end = start + BUCKET_US
        if now < end:
            state = "open"
        elif end > pipeline.synced_until_us:
            state = "closed"
        elif end > pipeline.sealed_until_us:
            state = "synced"
        else:
            state = "sealed"
        current, waiting = in_bucket[start, "current"], in_bucket[start, "waiting"]
        counted = in_bucket[start, "counted"]
        shown.append(
            {
                "start": iso(start),
                "end": iso(end),
                "state": state,
                "events": current + waiting + counted,
                "in_redis": current,
                "waiting": waiting,
                "counted": counted,
                "generations": generations.get(start, 0),
                "sync_at": iso(end + pipeline.sync_delay_us),
                "seal_at": iso(end + SEAL_AFTER_US),
            }
        )
    return shown
