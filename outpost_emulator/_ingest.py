"""`POST /v1/events/ingest`: validate all, store all (or nothing), de-duplicate, route."""

from __future__ import annotations

import asyncio
import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from outpost_emulator._errors import (
    Errors,
    denied_response,
    detail_response,
    validation_response,
)
from outpost_emulator._http import NO_BODY, hub_of, read_json
from outpost_emulator._limits import MAX_BODY_BYTES
from outpost_emulator._model import Identity
from outpost_emulator._public import activate_matching
from outpost_emulator._state import Hub
from outpost_emulator._validation import EventInput, validate_ingest

log = logging.getLogger("outpost_emulator")

_ERROR_DETAIL = {
    429: ("TooManyRequests", "Rate limit exceeded."),
    500: ("InternalServerError", "Internal Server Error"),
    503: ("ServiceUnavailable", "Service Unavailable"),
}


def store_events(hub: Hub, events: list[EventInput]) -> tuple[int, int]:
    """Store the valid events; returns (inserted, duplicates).

    An `external_id` already held, from any earlier request or earlier in this one, is a
    duplicate forever (Polar: ON CONFLICT (organization_id, external_id) DO NOTHING).
    """
    now = hub.now_us()
    reducers = hub.active_reducers()
    inserted = 0
    late: set[Identity] = set()
    stored = []
    for item in events:
        event = hub.store_event(
            name=item.name,
            timestamp_us=item.timestamp_us,
            identity=item.identity,
            external_id=item.external_id,
            metadata=item.metadata,
            now=now,
        )
        if event is None:
            continue
        inserted += 1
        stored.append(event)
        if hub.pipeline.place(event, reducers, now):
            late.add(event.identity)
    if hub.public_only and stored:
        # Polar's `event.ingested`: activation now, the recompute debounced per customer.
        activate_matching(hub, stored, now)
        for customer in {hub.customers.resolve(e.identity) for e in stored}:
            if customer is not None:
                hub.customer_changed(customer, now)
    if late:
        hub.push_snapshots(late)  # a late event landed in a closed bucket
    return inserted, len(events) - inserted


async def ingest_endpoint(request: Request) -> Response:
    hub = hub_of(request)
    hub.counters["http_ingest"] += 1
    denied = hub.tokens.check(request.headers, {"events:write"})
    if denied is not None:
        hub.counters["http_auth_rejected"] += 1
        return denied_response(denied)

    # Read the whole body first: a client that gives up during a hang still had its request
    # received, and it is processed all the same.
    if len(await request.body()) > MAX_BODY_BYTES:
        hub.counters["ingest_too_large"] += 1
        return detail_response(413, "Request Entity Too Large", error="RequestEntityTooLarge")
    errors = Errors()
    body = await read_json(request, errors)

    hang = hub.faults.take("hang")
    if hang is not None:
        log.info("ingest: fault, hanging %.3fs before processing", hang.seconds)
        await asyncio.sleep(hang.seconds)
        hub.tick()  # the clock moved while we hung
    failure = hub.faults.take("error")
    if failure is not None and failure.status is not None:
        log.info("ingest: fault, answering %d", failure.status)
        hub.counters["ingest_faulted"] += 1
        error, detail = _ERROR_DETAIL.get(failure.status, ("Error", "Injected failure"))
        headers = {}
        if failure.retry_after is not None:
            seconds = failure.retry_after
            headers["Retry-After"] = str(int(seconds)) if seconds == int(seconds) else str(seconds)
        return detail_response(failure.status, detail, error=error, headers=headers)
    lose = hub.faults.take("lose_response")

    events: list[EventInput] = []
    if body is not NO_BODY:
        events, errors = validate_ingest(body, hub.now_us(), hub.customers)
    if errors:
        hub.counters["ingest_rejected"] += 1
        log.info("ingest: 422, %d error(s)", len(errors))
        response: Response = validation_response(errors)
    else:
        inserted, duplicates = store_events(hub, events)
        hub.counters["events_inserted"] += inserted
        hub.counters["events_duplicate"] += duplicates
        log.info(
            "ingest: %d event(s), inserted=%d duplicates=%d", len(events), inserted, duplicates
        )
        response = JSONResponse({"inserted": inserted, "duplicates": duplicates})

    if lose is not None:
        hub.counters["ingest_responses_lost"] += 1
        log.info("ingest: fault, processed but dropping the connection without a response")
        await _drop_connection(request, hub)
    return response


async def _drop_connection(request: Request, hub: Hub) -> None:
    if hub.transport_finder is None:
        raise RuntimeError("cannot drop the connection: no transport finder (see docs)")
    client = request.scope.get("client")
    transport = hub.transport_finder((str(client[0]), int(client[1]))) if client else None
    if transport is None:
        return  # the client is gone already: there is nobody to answer
    transport.abort()
    # Wait until the server has seen the disconnect, so it does not write a 500 instead.
    while (await request.receive())["type"] != "http.disconnect":
        pass
