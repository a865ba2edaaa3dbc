"""The admin API under `/__emulator/` (no auth): time, customers, credits, tokens, faults, state.

Each operation is a plain function `op(hub, body) -> dict` run on the server loop; the HTTP
route and the Python API (`Emulator`) both call it, so they validate and behave the same.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import math
import urllib.parse
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from outpost_emulator._customers import CustomerKey
from outpost_emulator._errors import Errors, detail_response
from outpost_emulator._faults import IngestFault
from outpost_emulator._filters import parse_meter_create
from outpost_emulator._http import NO_BODY, hub_of, read_json, short
from outpost_emulator._meters import create_meter, customer_meter_item
from outpost_emulator._model import Identity, JsonObject, Meter
from outpost_emulator._public import Reset, claim, true_figures, update_customer_meter
from outpost_emulator._state import Hub
from outpost_emulator._summary import dashboard_summary
from outpost_emulator._telemetry import telemetry_dump
from outpost_emulator._timeutil import SECOND_US, iso, parse_iso
from outpost_emulator._webhooks import HookFaults

log = logging.getLogger("outpost_emulator")


class EmulatorError(Exception):
    """An admin operation refused its input (HTTP status and detail, as the admin API says)."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


def _fail(detail: str, status: int = 422) -> EmulatorError:
    return EmulatorError(status, detail)


def _number(body: JsonObject, key: str, *, minimum: float) -> float:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(f"`{key}` must be a number")
    if value < minimum:
        raise _fail(f"`{key}` must be >= {minimum:g}")
    return float(value)


def _count(spec: JsonObject) -> int:
    value = spec.get("count", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail("`count` must be an integer >= 1")
    return value


def _only(body: JsonObject, allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise _fail(f"unknown field(s): {', '.join(unknown)}; expected some of {sorted(allowed)}")


def _identity(hub: Hub, body: JsonObject) -> Identity:
    external, customer_id = body.get("external_customer_id"), body.get("customer_id")
    if (external is None) == (customer_id is None):
        raise _fail("give exactly one of `external_customer_id` or `customer_id`")
    if external is not None:
        if not isinstance(external, str):
            raise _fail("`external_customer_id` must be a string")
        return ("external_customer_id", external)
    customer = hub.customers.get(customer_id) if isinstance(customer_id, str) else None
    if customer is None:
        raise _fail(f"no customer {customer_id!r}", 404)
    return ("customer_id", customer.id)


# Operations --------------------------------------------------------------------------------


def clock_state(hub: Hub, body: JsonObject | None = None) -> JsonObject:
    now = hub.now_us()
    return {"now": iso(now), "now_us": now, "speed": hub.clock.speed, "frozen": hub.clock.frozen}


def op_clock(hub: Hub, body: JsonObject) -> JsonObject:
    _only(body, {"advance", "set", "freeze", "speed"})
    freeze = body.get("freeze")
    if freeze is not None and not isinstance(freeze, bool):
        raise _fail("`freeze` must be a boolean")
    speed = _number(body, "speed", minimum=1) if "speed" in body else None
    instant = None
    if "set" in body:
        try:
            instant = parse_iso(body["set"]) if isinstance(body["set"], str) else None
        except ValueError:
            instant = None
        if instant is None or instant.tzinfo is None:
            raise _fail("`set` must be an ISO-8601 instant with a timezone")
    advance = _number(body, "advance", minimum=0) if "advance" in body else None
    if freeze is True:
        hub.clock.freeze()
    elif freeze is False:
        hub.clock.unfreeze()
    if speed is not None:
        hub.clock.set_speed(speed)
    if instant is not None:
        hub.clock.set(instant)
    if advance is not None:
        hub.clock.advance(advance)
    hub.tick()  # due syncs and seals run before we answer
    return clock_state(hub)


def op_customers(hub: Hub, body: JsonObject) -> JsonObject:
    _only(body, {"external_id"})
    external_id = body.get("external_id")
    if external_id is not None and not isinstance(external_id, str):
        raise _fail("`external_id` must be a string or null")
    try:
        customer = hub.customers.create(external_id, hub.now_us())
    except ValueError as exc:
        raise _fail(str(exc), 409) from None
    if external_id is not None:
        # The external id's events are this customer's now: its snapshots name a new alias.
        hub.push_snapshots({("external_customer_id", external_id)})
        claim(hub.public, external_id, customer.id)
        hub.customer_changed(("customer", customer.id), hub.now_us())
    return customer.to_json()


def op_credits(hub: Hub, body: JsonObject) -> JsonObject:
    _only(body, {"meter_id", "external_customer_id", "customer_id", "units"})
    meter_id = body.get("meter_id")
    if not isinstance(meter_id, str) or meter_id not in hub.meters:
        raise _fail(f"no meter {meter_id!r}", 404)
    units = body.get("units")
    if isinstance(units, bool) or not isinstance(units, int):
        raise _fail("`units` must be an integer (negative revokes)")
    identity = _identity(hub, body)
    now = hub.now_us()
    hub.credits.grant(identity, meter_id, units, now)
    customer = hub.customers.resolve(identity)
    assert customer is not None
    _credits_changed(hub, customer, hub.meters[meter_id], now)
    hub.push_snapshots({identity})  # "that customer's credits change"
    credited = true_figures(hub, customer, hub.meters[meter_id])[1]
    return {
        "meter_id": meter_id,
        identity[0]: identity[1],
        "units": units,
        "credited_units": credited,
    }


def _credits_changed(hub: Hub, customer: CustomerKey, meter: Meter, now: int) -> None:
    """Polar recomputes the meter at once on a grant, a revoke or a cycle, and every
    benefit-grant webhook also sends `customer.state_changed`."""
    if hub.public_only:
        update_customer_meter(hub, customer, meter, now, activate=True)
        hub.webhooks.state_changed(customer, now)


def op_cycle(hub: Hub, body: JsonObject) -> JsonObject:
    """A billing cycle: `meter.reset` now, then the rollover credit, then the new credit."""
    _only(body, {"meter_id", "external_customer_id", "customer_id", "units", "rollover_units"})
    meter_id = body.get("meter_id")
    if not isinstance(meter_id, str) or meter_id not in hub.meters:
        raise _fail(f"no meter {meter_id!r}", 404)
    amounts = []
    for key in ("units", "rollover_units"):
        value = body.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _fail(f"`{key}` must be an integer >= 0")
        amounts.append(value)
    units, rollover = amounts
    identity = _identity(hub, body)
    customer = hub.customers.resolve(identity)
    assert customer is not None
    now = hub.now_us()
    hub.public.resets[(customer, meter_id)] = Reset(now, hub.credits.next_seq())
    for amount in (rollover, units):
        if amount:
            hub.credits.grant(identity, meter_id, amount, now)
    _credits_changed(hub, customer, hub.meters[meter_id], now)
    hub.push_snapshots({identity})
    consumed, credited = true_figures(hub, customer, hub.meters[meter_id])
    return {"meter_id": meter_id, "reset_at": iso(now), "consumed_units": consumed,
            "credited_units": credited}  # fmt: skip


def op_webhooks(hub: Hub, body: JsonObject) -> JsonObject:
    """Register an endpoint for `customer.state_changed` (its secret is made when not given)."""
    _only(body, {"url", "secret"})
    url, secret = body.get("url"), body.get("secret")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise _fail("`url` must be an http(s) URL")
    if secret is not None and not isinstance(secret, str):
        raise _fail("`secret` must be a string whsec_<base64>")
    try:
        endpoint = hub.webhooks.register(url, secret)
    except ValueError as exc:
        raise _fail(f"`secret` must be whsec_<base64> ({exc})") from None
    return endpoint.to_json()


def op_tokens(hub: Hub, body: JsonObject) -> JsonObject:
    _only(body, {"token", "scopes"})
    token, scopes = body.get("token"), body.get("scopes")
    if not isinstance(token, str) or not token:
        raise _fail("`token` must be a non-empty string")
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise _fail("`scopes` must be a list of strings")
    hub.tokens.add(token, scopes)
    return {"token": token, "scopes": sorted(set(scopes))}


def op_faults(hub: Hub, body: JsonObject) -> JsonObject:
    _only(
        body,
        {"ingest_error", "ingest_hang", "ingest_lose_response", "drop_websockets", "syncs",
         "snapshot_delay", "clear", "send_frames", "webhook_drop", "webhook_delay",
         "replica_lag"},
    )  # fmt: skip
    # Validate everything first, then apply: a bad request changes nothing.
    todo: list[Callable[[], None]] = []
    if body.get("clear") is True:
        todo.append(lambda: _clear(hub))
    elif "clear" in body and body["clear"] is not False:
        raise _fail("`clear` must be a boolean")
    if "ingest_error" in body:
        spec = _spec(body, "ingest_error", {"status", "count", "retry_after"})
        status = spec.get("status")
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise _fail("`ingest_error.status` must be an HTTP error status, e.g. 429, 500, 503")
        retry = (
            _number(spec, "retry_after", minimum=0) if spec.get("retry_after") is not None else None
        )
        if status == 429 and retry is None:
            retry = 1.0  # a 429 always carries Retry-After
        fault = IngestFault("error", _count(spec), status=status, retry_after=retry)
        todo.append(lambda: hub.faults.add(fault))
    if "ingest_hang" in body:
        spec = _spec(body, "ingest_hang", {"seconds", "count"})
        if "seconds" not in spec:
            raise _fail("`ingest_hang.seconds` is required")
        hang = IngestFault("hang", _count(spec), seconds=_number(spec, "seconds", minimum=0))
        todo.append(lambda: hub.faults.add(hang))
    if "ingest_lose_response" in body:
        spec = _spec(body, "ingest_lose_response", {"count"})
        lose = IngestFault("lose_response", _count(spec))
        todo.append(lambda: hub.faults.add(lose))
    if "drop_websockets" in body:
        mode = body["drop_websockets"]
        if mode not in ("close", "abort"):
            raise _fail('`drop_websockets` must be "close" (code 1012) or "abort"')
        todo.append(lambda: _drop(hub, mode))
    if "send_frames" in body:
        frames = _raw_frames(body["send_frames"])
        todo.append(lambda: _send_frames(hub, frames))
    if "syncs" in body:
        if body["syncs"] not in ("pause", "resume"):
            raise _fail('`syncs` must be "pause" or "resume"')
        todo.append(lambda: _syncs(hub, body["syncs"]))
    if "snapshot_delay" in body:
        delay = _number(body, "snapshot_delay", minimum=0)
        todo.append(lambda: setattr(hub.faults, "snapshot_delay_s", delay))
    if "webhook_drop" in body:
        drops = _count(_spec(body, "webhook_drop", {"count"}))
        todo.append(lambda: setattr(hub.webhooks.faults, "drop", drops))
    if "webhook_delay" in body:
        spec = _spec(body, "webhook_delay", {"seconds", "count"})
        if "seconds" not in spec:
            raise _fail("`webhook_delay.seconds` is required")
        held_us, held = round(_number(spec, "seconds", minimum=0) * SECOND_US), _count(spec)
        todo.append(lambda: _delay_webhooks(hub, held_us, held))
    if "replica_lag" in body:
        lag_us = round(_number(body, "replica_lag", minimum=0) * SECOND_US)
        todo.append(lambda: setattr(hub, "replica_lag_us", lag_us))
    for action in todo:
        action()
    return _faults_state(hub)


def _faults_state(hub: Hub) -> JsonObject:
    return {
        **hub.faults.to_json(),
        "syncs_paused": hub.pipeline.paused,
        "webhooks": hub.webhooks.faults.to_json(),
        "replica_lag_s": hub.replica_lag_us / SECOND_US,
    }


def _delay_webhooks(hub: Hub, delay_us: int, count: int) -> None:
    hub.webhooks.faults.delay_us = delay_us
    hub.webhooks.faults.delay_count = count


def _spec(body: JsonObject, key: str, allowed: set[str]) -> JsonObject:
    spec = body[key]
    if not isinstance(spec, dict):
        raise _fail(f"`{key}` must be an object")
    _only(spec, allowed)
    return spec


def _clear(hub: Hub) -> None:
    hub.faults.clear()
    hub.webhooks.faults = HookFaults()
    _syncs(hub, "resume")


def _syncs(hub: Hub, action: str) -> None:
    if action == "pause":
        hub.pipeline.pause()
        return
    moved = hub.pipeline.resume(hub.now_us(), hub.active_reducers())
    if moved:
        hub.push_snapshots(moved)


def _raw_frames(value: object) -> list[str | bytes]:
    """`send_frames`: a list of {"text": "..."} or {"binary_base64": "..."}."""
    if not isinstance(value, list):
        raise _fail("`send_frames` must be a list")
    frames: list[str | bytes] = []
    for item in value:
        if isinstance(item, dict) and isinstance(item.get("text"), str) and len(item) == 1:
            frames.append(item["text"])
        elif isinstance(item, dict) and isinstance(item.get("binary_base64"), str):
            try:
                frames.append(base64.b64decode(item["binary_base64"], validate=True))
            except ValueError as exc:
                raise _fail("`binary_base64` is not base64") from exc
        else:
            raise _fail('each frame is {"text": str} or {"binary_base64": str}')
    return frames


def _send_frames(hub: Hub, frames: list[str | bytes]) -> None:
    for connection in hub.connections.all():
        for frame in frames:
            connection.send_raw(frame)


def _drop(hub: Hub, mode: str) -> None:
    for connection in hub.connections.all():
        if mode == "abort" and connection.abort():
            continue
        connection.close(1012)  # "service restart"; also the fallback when abort is impossible


def op_state(hub: Hub, body: JsonObject | None = None) -> JsonObject:
    return hub.state()


def op_telemetry(hub: Hub, body: JsonObject | None = None) -> JsonObject:
    return telemetry_dump(hub)


def op_customer_meter(hub: Hub, body: JsonObject) -> JsonObject:
    """One customer meter as a recompute now would find it (the true balance, whatever the
    public API's stored row says), with zeros when Polar would have no row yet."""
    _only(body, {"meter_id", "external_customer_id", "customer_id"})
    meter_id = body.get("meter_id")
    meter = hub.meters.get(meter_id) if isinstance(meter_id, str) else None
    if meter is None:
        raise _fail(f"no meter {body.get('meter_id')!r}", 404)
    customer = hub.customers.resolve(_identity(hub, body))
    assert customer is not None
    return customer_meter_item(hub, customer, meter)


def op_create_meter(hub: Hub, body: JsonObject) -> JsonObject:
    errors = Errors()
    fields = parse_meter_create(body, errors)
    if errors or fields is None:
        raise EmulatorError(422, errors.items)
    return create_meter(hub, fields).to_json()


def op_ingest_delays(hub: Hub, body: JsonObject | None = None) -> JsonObject:
    """How long after its timestamp each stored event reached Polar (its ``ingested_at``), in
    milliseconds: the count and an evenly spaced sample of at most 20,000 (for benchmarks; the
    timestamps are the tracker's clock, the emulator's runs from the wall clock)."""
    delays = [(e.ingested_at_us - e.timestamp_us) / 1000 for e in hub.events]
    step = max(1, len(delays) // 20_000)
    return {"count": len(delays), "sample_ms": delays[::step]}


Op = Callable[[Hub, JsonObject], JsonObject]
OPERATIONS: dict[tuple[str, str], Op] = {
    ("GET", "clock"): clock_state,
    ("POST", "clock"): op_clock,
    ("POST", "customers"): op_customers,
    ("POST", "credits"): op_credits,
    ("POST", "tokens"): op_tokens,
    ("GET", "faults"): lambda hub, _: _faults_state(hub),
    ("POST", "cycle"): op_cycle,
    ("POST", "webhooks"): op_webhooks,
    ("GET", "webhooks"): lambda hub, _: hub.webhooks.to_json(),
    ("POST", "faults"): op_faults,
    ("GET", "state"): op_state,
    ("GET", "summary"): lambda hub, _: dashboard_summary(hub),  # what the dashboard shows
    ("GET", "telemetry"): op_telemetry,
    ("GET", "ingest-delays"): op_ingest_delays,
    ("POST", "customer-meter"): op_customer_meter,
}


def _loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_of(authority: str) -> str | None:
    try:
        return urllib.parse.urlsplit(f"//{authority}").hostname
    except ValueError:
        return None


def refusal(request: Request, remote_allowed: bool) -> str | None:
    """Why the admin API (no authentication) refuses this request, or ``None``.

    It is a local tool: a request must name a loopback host (a web page that rebinds its own
    name to 127.0.0.1 still sends its name), a browser's request must come from a loopback
    origin or the emulator's own pages, and a POST must be JSON (a web page cannot send JSON to
    another origin without asking first, which the emulator never grants)."""
    host = request.headers.get("host", "")
    if not remote_allowed and not _loopback(_host_of(host)):
        return (
            f"the emulator's admin API answers only requests to a loopback address, not to "
            f"{host!r} (start it with --allow-remote to serve other hosts)"
        )
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        parts = urllib.parse.urlsplit(origin)
        if not _loopback(parts.hostname) and parts.netloc != host:
            return f"the emulator's admin API answers only pages of this machine, not {origin!r}"
    elif origin == "null":
        return "the emulator's admin API answers no page of an opaque origin"
    sent = (
        request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers
    )
    if request.method == "POST" and (sent or origin is not None):  # a body, or a browser's POST
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/json":
            return f"the emulator's admin API takes JSON bodies only (Content-Type {kind!r})"
    return None


async def admin_endpoint(request: Request) -> Response:
    hub = hub_of(request)
    hub.counters["http_admin"] += 1
    refused = refusal(request, hub.remote_admin)
    if refused is not None:
        log.warning("admin %s %s refused: %s", request.method, request.url.path, refused)
        return detail_response(403, refused)
    name = request.path_params["name"]
    op = OPERATIONS.get((request.method, name))
    if op is None:
        known = any(n == name for _, n in OPERATIONS)
        return detail_response(
            405 if known else 404, "Method Not Allowed" if known else "Not Found"
        )
    body: Any = {}
    if request.method == "POST" and (await request.body()).strip():
        errors = Errors()
        body = await read_json(request, errors)
        if body is NO_BODY:
            return JSONResponse({"detail": errors.items}, status_code=422)
        if not isinstance(body, dict):
            return detail_response(422, "the body must be a JSON object")
    try:
        result = op(hub, body)
    except EmulatorError as exc:
        log.info(
            "admin %s %s %s -> %d %s", request.method, name, short(body), exc.status, exc.detail
        )
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)
    if request.method == "POST":
        log.info("admin %s %s %s -> 200", request.method, name, short(body))
    return JSONResponse(result)
