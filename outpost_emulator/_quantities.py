"""`GET /v1/meters/{id}/quantities`: usage recomputed on request over a time window.

As Polar: it reads a replica (events ingested more than the replica lag ago), windows events by
their `timestamp` (not by when they were ingested), buckets them by `date_trunc(interval, ...)`
over `generate_series(trunc(start), end, interval)` (events after the last series point are
dropped), and reports `total` as the sum of buckets for count and sum, the max or min of
bucket values for max and min, and, for avg and unique, over every event of the customer with
no time filter. Only the UTC timezone is served.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from outpost_emulator._customers import normalize_uuid
from outpost_emulator._errors import Errors, denied_response, detail_response, validation_response
from outpost_emulator._http import hub_of, query_list
from outpost_emulator._matching import consumed
from outpost_emulator._model import Meter, StoredEvent
from outpost_emulator._state import Hub
from outpost_emulator._timeutil import from_us, iso, parse_iso, to_us

INTERVALS = ("hour", "day", "week", "month", "year")
_MAX_DAYS = {"hour": 7, "day": 366}


def trunc(instant: datetime, interval: str) -> datetime:
    """PostgreSQL's date_trunc in UTC."""
    if interval == "hour":
        return instant.replace(minute=0, second=0, microsecond=0)
    day = instant.replace(hour=0, minute=0, second=0, microsecond=0)
    if interval == "day":
        return day
    if interval == "week":
        return day - timedelta(days=day.weekday())
    if interval == "month":
        return day.replace(day=1)
    return day.replace(month=1, day=1)


def step(instant: datetime, interval: str) -> datetime:
    if interval == "hour":
        return instant + timedelta(hours=1)
    if interval == "day":
        return instant + timedelta(days=1)
    if interval == "week":
        return instant + timedelta(weeks=1)
    if interval == "month":
        year, month = divmod(instant.month, 12)
        return instant.replace(year=instant.year + year, month=month + 1)
    return instant.replace(year=instant.year + 1)


def _bucket_us(event: StoredEvent, interval: str) -> int:
    return to_us(trunc(from_us(event.timestamp_us), interval))


def quantities(
    meter: Meter, events: list[StoredEvent], start: datetime, end: datetime, interval: str
) -> dict[str, object]:
    series = []
    point = trunc(start, interval)
    while point <= end:
        series.append(point)
        point = step(point, interval)
    rows = []
    values = []
    for index, point in enumerate(series):
        low = to_us(point)
        high = to_us(series[index + 1]) if index + 1 < len(series) else to_us(step(point, interval))
        inside = [
            e for e in events if low <= to_us(trunc(from_us(e.timestamp_us), interval)) < high
        ]
        quantity = consumed(meter.filter, meter.aggregation, inside)
        rows.append({"timestamp": iso(low), "quantity": quantity})
        values.append(quantity)
    func = meter.aggregation.func
    if func in ("avg", "unique"):
        total = consumed(meter.filter, meter.aggregation, events)  # no time filter, as Polar
    elif func == "max":
        total = max(values, default=0.0)
    elif func == "min":
        total = min(values, default=0.0)
    else:
        total = sum(values)
    return {"quantities": rows, "total": total}


async def quantities_endpoint(request: Request) -> Response:
    hub = hub_of(request)
    hub.counters["http_quantities"] += 1
    denied = hub.tokens.check(request.headers, {"meters:read", "meters:write"})
    if denied is not None:
        return denied_response(denied)
    meter_id = normalize_uuid(request.path_params["id"])
    meter = hub.meters.get(meter_id) if meter_id else None
    if meter is None:
        return detail_response(404, "Not found", error="ResourceNotFound")
    errors = Errors()
    params = request.query_params
    instants = {}
    for name in ("start_timestamp", "end_timestamp"):
        raw = params.get(name)
        try:
            instants[name] = parse_iso(raw) if raw is not None else None
        except ValueError:
            instants[name] = None
        if instants[name] is None or instants[name].tzinfo is None:  # type: ignore[union-attr]
            errors.add(("query", name), "datetime_parsing", "Input should be a valid datetime", raw)
    interval = params.get("interval")
    if interval not in INTERVALS:
        errors.add(
            ("query", "interval"),
            "enum",
            "Input should be one of " + ", ".join(INTERVALS),
            interval,
        )
    if params.get("timezone", "UTC") != "UTC":
        errors.add(
            ("query", "timezone"), "value_error", "Only UTC is served", params.get("timezone")
        )
    if errors:
        return validation_response(errors)
    start, end = instants["start_timestamp"], instants["end_timestamp"]
    assert start is not None and end is not None and interval is not None
    limit = _MAX_DAYS.get(interval)
    if limit is not None and end - start > timedelta(days=limit):
        errors.add(
            ("query",), "value_error", f"The interval {interval} spans at most {limit} days", None
        )
        return validation_response(errors)
    visible_before = hub.now_us() - hub.replica_lag_us
    events = _customer_events(hub, request, errors)
    if errors:
        return validation_response(errors)
    events = [e for e in events if e.ingested_at_us <= visible_before]
    return JSONResponse(quantities(meter, events, start, end, interval))


def _customer_events(hub: Hub, request: Request, errors: Errors) -> list[StoredEvent]:
    customer_ids = query_list(request, "customer_id")
    external_ids = query_list(request, "external_customer_id")
    if customer_ids is None and external_ids is None:
        return list(hub.events)
    found: dict[int, StoredEvent] = {}
    for raw in customer_ids or []:
        customer = hub.customers.get(raw)
        if customer is None:
            errors.add(
                ("query", "customer_id"), "uuid_parsing", "Input should be a valid UUID", raw
            )
            continue
        for e in hub.events_of(("customer", customer.id)):
            found[e.seq] = e
    for external in external_ids or []:
        key = hub.customers.resolve(("external_customer_id", external))
        assert key is not None  # an external id always resolves
        for e in hub.events_of(key):
            found[e.seq] = e
    return [found[seq] for seq in sorted(found)]
