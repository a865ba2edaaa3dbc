"""`GET|POST /v1/meters/`, `GET /v1/meters/{id}` and `GET /v1/customer-meters/`."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from outpost_emulator._customers import CustomerKey, normalize_uuid
from outpost_emulator._errors import (
    Errors,
    denied_response,
    detail_response,
    validation_response,
)
from outpost_emulator._filters import parse_meter_create
from outpost_emulator._http import NO_BODY, hub_of, paginate, pagination, query_list, read_json
from outpost_emulator._matching import sql_matches
from outpost_emulator._model import JsonObject, Meter, Reducer
from outpost_emulator._public import row_item_figures, true_figures
from outpost_emulator._state import Hub
from outpost_emulator._timeutil import iso

log = logging.getLogger("outpost_emulator")
_ITEM_NS = uuid.UUID("6f1d8a4e-33a9-4d5c-9d1e-0c6b1f5a2e77")


def create_meter(hub: Hub, fields: JsonObject) -> Meter:
    """Store a validated meter and its reducer, then tell every socket."""
    now = hub.now_us()
    meter = Meter(
        id=str(uuid.uuid4()),
        name=fields["name"],
        filter=fields["filter"],
        aggregation=fields["aggregation"],
        organization_id=hub.organization_id,
        created_at_us=now,
        unit=fields.get("unit", "scalar"),
        custom_label=fields.get("custom_label"),
        custom_multiplier=fields.get("custom_multiplier"),
        metadata=fields.get("metadata") or {},
    )
    # Polar's ReducerService.sync_meter: one reducer per meter, same filter and aggregation.
    reducer = Reducer(str(uuid.uuid4()), meter.filter, meter.aggregation, [meter.id])
    hub.add_meter(meter, reducer, now)
    hub.push_configuration()
    log.info("meter created: %s %s (reducer %s)", meter.id, meter.name, reducer.id)
    return meter


def _admitted(request: Request, counter: str, scopes: set[str]) -> tuple[Hub, Response | None]:
    """The hub, with the request counted under ``counter``; and the answer to give instead when
    the token has none of ``scopes``."""
    hub = hub_of(request)
    hub.counters[counter] += 1
    denied = hub.tokens.check(request.headers, scopes)
    return hub, None if denied is None else denied_response(denied)


async def meters_endpoint(request: Request) -> Response:
    creating = request.method == "POST"
    scopes = {"meters:write"} if creating else {"meters:read", "meters:write"}
    hub, refused = _admitted(request, "http_meters", scopes)
    if refused is not None:
        return refused
    if creating:
        return await _create(request, hub)
    errors = Errors()
    page, limit = pagination(request, errors)
    if errors:
        return validation_response(errors)
    query = (request.query_params.get("query") or "").lower()
    archived = request.query_params.get("is_archived")
    items = [m.to_json() for m in hub.meters.values() if query in m.name.lower()]
    if archived in ("true", "1"):
        items = []  # the emulator never archives meters
    return JSONResponse(paginate(items, page, limit))


async def _create(request: Request, hub: Hub) -> Response:
    errors = Errors()
    body = await read_json(request, errors)
    fields = None if body is NO_BODY else parse_meter_create(body, errors)
    if errors or fields is None:
        return validation_response(errors)
    return JSONResponse(create_meter(hub, fields).to_json(), status_code=201)


async def meter_endpoint(request: Request) -> Response:
    hub, refused = _admitted(request, "http_meters", {"meters:read", "meters:write"})
    if refused is not None:
        return refused
    raw = request.path_params["id"]
    meter_id = normalize_uuid(raw)
    if meter_id is None:
        errors = Errors()
        errors.add(("path", "id"), "uuid_parsing", "Input should be a valid UUID", raw)
        return validation_response(errors)
    meter = hub.meters.get(meter_id)
    if meter is None:
        return detail_response(404, "Not found", error="ResourceNotFound")
    return JSONResponse(meter.to_json())


# Customer meters ---------------------------------------------------------------------------


def customer_meter_item(
    hub: Hub, customer: CustomerKey, meter: Meter, *, stored: bool = False
) -> JsonObject:
    """Polar's CustomerMeter for one customer and meter: as a recompute now would find it
    (every stored event of the current window), or with ``stored`` as the public API's row
    holds it (recomputed by the debounced job)."""
    row = hub.public.rows.get((customer, meter.id))
    if stored and row is not None:
        used, credited, _ = row_item_figures(row)
    else:
        used, credited = true_figures(hub, customer, meter)
    modified = None if row is None or row.modified_at_us is None else iso(row.modified_at_us)
    customer_id, external_id = hub.customers.describe(customer)
    real = hub.customers.get(customer_id) if customer_id else None
    return {
        "id": str(uuid.uuid5(_ITEM_NS, f"{customer[0]}:{customer[1]}:{meter.id}")),
        "created_at": iso(meter.created_at_us if row is None else row.created_at_us),
        "modified_at": modified,
        "customer_id": customer_id,
        "external_customer_id": external_id,
        "meter_id": meter.id,
        "consumed_units": used,
        "credited_units": credited,
        "balance": credited - used,
        "customer": None if real is None else real.to_json(),
        "meter": meter.to_json(),
    }


def _is_active(hub: Hub, customer: CustomerKey, meter: Meter) -> bool:
    # Polar creates the customer_meters row on the first matching event or credit.
    if hub.credits.has_any(hub.customers.identities(customer), meter.id):
        return True
    return any(sql_matches(meter.filter, e) for e in hub.events_of(customer))


def _candidates(hub: Hub) -> list[CustomerKey]:
    keys: dict[CustomerKey, None] = {("customer", c.id): None for c in hub.customers.all()}
    for identity in [*hub.identities_with_events(), *hub.credits.identities()]:
        key = hub.customers.resolve(identity)
        if key is not None:
            keys.setdefault(key, None)
    return list(keys)


def list_customer_meters(
    hub: Hub,
    *,
    customer_ids: list[str] | None = None,
    external_customer_ids: list[str] | None = None,
    meter_ids: list[str] | None = None,
) -> list[JsonObject]:
    if hub.public_only:
        return _stored_rows(hub, customer_ids, external_customer_ids, meter_ids)
    items = []
    for customer in _candidates(hub):
        customer_id, external_id = hub.customers.describe(customer)
        if customer_ids is not None and customer_id not in customer_ids:
            continue
        if external_customer_ids is not None and external_id not in external_customer_ids:
            continue
        for meter in hub.meters.values():
            if meter_ids is not None and meter.id not in meter_ids:
                continue
            if _is_active(hub, customer, meter):
                items.append(customer_meter_item(hub, customer, meter))
    return items


def _stored_rows(
    hub: Hub,
    customer_ids: list[str] | None,
    external_customer_ids: list[str] | None,
    meter_ids: list[str] | None,
) -> list[JsonObject]:
    """Polar's rows, sorted by `-modified_at` (PostgreSQL puts NULLs first in DESC order)."""
    chosen = []
    for (customer, meter_id), row in hub.public.rows.items():
        customer_id, external_id = hub.customers.describe(customer)
        meter = hub.meters.get(meter_id)
        if meter is None:
            continue
        if customer_ids is not None and customer_id not in customer_ids:
            continue
        if external_customer_ids is not None and external_id not in external_customer_ids:
            continue
        if meter_ids is not None and meter_id not in meter_ids:
            continue
        chosen.append((row.modified_at_us, customer_meter_item(hub, customer, meter, stored=True)))
    chosen.sort(key=lambda item: (item[0] is not None, -(item[0] or 0)))
    return [item for _, item in chosen]


async def customer_meters_endpoint(request: Request) -> Response:
    scopes = {"customer_meters:read", "customer_meters:write"}
    hub, refused = _admitted(request, "http_customer_meters", scopes)
    if refused is not None:
        return refused
    errors = Errors()
    page, limit = pagination(request, errors)
    ids: dict[str, list[str] | None] = {}
    for name in ("customer_id", "meter_id"):
        values = query_list(request, name)
        ids[name] = None if values is None else _uuids(values, name, errors)
    if errors:
        return validation_response(errors)
    items = list_customer_meters(
        hub,
        customer_ids=ids["customer_id"],
        external_customer_ids=query_list(request, "external_customer_id"),
        meter_ids=ids["meter_id"],
    )
    return JSONResponse(paginate(items, page, limit))


def _uuids(values: list[str], name: str, errors: Errors) -> list[str]:
    found = []
    for i, value in enumerate(values):
        normalized = normalize_uuid(value)
        if normalized is None:
            loc: tuple[Any, ...] = ("query", name, i) if len(values) > 1 else ("query", name)
            errors.add(loc, "uuid_parsing", "Input should be a valid UUID", value)
        else:
            found.append(normalized)
    return found
