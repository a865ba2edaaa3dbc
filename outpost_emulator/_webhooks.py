"""`customer.state_changed` webhooks, signed as Standard Webhooks, delivered with retries.

Polar enqueues the `customer.webhook` job when a customer's meter rows change or a credit is
granted or revoked; the job is debounced (1 s minimum, 5 s maximum) and builds the customer's
state when it runs. Each endpoint then gets a POST with `webhook-id`, `webhook-timestamp` and
`webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`, keyed by the base64 part
of the endpoint's `whsec_` secret. A delivery that does not get a 2xx is retried with backoff
(up to 10 retries, at most 20 minutes apart). Every time here is the emulator's clock.

Faults: the next N deliveries dropped (never sent, never retried: a lost webhook), or held
for some seconds of emulator time (late, and so possibly out of order).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import secrets
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from outpost_emulator._customers import CustomerKey
from outpost_emulator._debounce import Debouncer
from outpost_emulator._model import JsonObject
from outpost_emulator._timeutil import SECOND_US, iso

if TYPE_CHECKING:
    from outpost_emulator._state import Hub

log = logging.getLogger("outpost_emulator")

DEBOUNCE_MIN_US = 1 * SECOND_US
DEBOUNCE_MAX_US = 5 * SECOND_US
MAX_RETRIES = 10
MAX_BACKOFF_US = 20 * 60 * SECOND_US
TIMEOUT_S = 10.0


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret; ValueError when it is not one."""
    if not secret.startswith("whsec_"):
        raise ValueError("a webhook secret looks like whsec_<base64>")
    return base64.b64decode(secret.removeprefix("whsec_"), validate=True)


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def backoff_us(attempt: int) -> int:
    """Wait before retry `attempt` (1-based): 5 s doubling, at most 20 minutes."""
    return int(min(MAX_BACKOFF_US, 5 * SECOND_US * 2 ** (attempt - 1)))


@dataclass(frozen=True, slots=True)
class Endpoint:
    id: str
    url: str
    secret: str

    def to_json(self) -> JsonObject:
        return {"id": self.id, "url": self.url, "secret": self.secret}


@dataclass(slots=True)
class Delivery:
    message_id: str
    endpoint: Endpoint
    body: bytes
    due_us: int
    attempt: int = 0  # attempts made so far
    held: bool = False  # a delay fault held it once
    outcome: str = "pending"  # pending, sending, delivered, failed, dropped

    def to_json(self) -> JsonObject:
        return {
            "message_id": self.message_id,
            "endpoint_id": self.endpoint.id,
            "attempts": self.attempt,
            "outcome": self.outcome,
            "due": iso(self.due_us),
        }


@dataclass(slots=True)
class HookFaults:
    drop: int = 0  # the next N deliveries are lost
    delay_us: int = 0  # the next `delay_count` deliveries wait this long first
    delay_count: int = 0

    def to_json(self) -> JsonObject:
        return {
            "drop": self.drop,
            "delay_s": self.delay_us / SECOND_US,
            "delay_count": self.delay_count,
        }


@dataclass(slots=True)
class Webhooks:
    endpoints: list[Endpoint] = field(default_factory=list)
    jobs: Debouncer[CustomerKey] = field(
        default_factory=lambda: Debouncer(DEBOUNCE_MIN_US, DEBOUNCE_MAX_US)
    )
    deliveries: list[Delivery] = field(default_factory=list)
    faults: HookFaults = field(default_factory=HookFaults)
    _client: httpx.AsyncClient | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def register(self, url: str, secret: str | None) -> Endpoint:
        endpoint = Endpoint(str(uuid.uuid4()), url, secret or new_secret())
        secret_key(endpoint.secret)  # refuse a malformed one now
        self.endpoints.append(endpoint)
        return endpoint

    def state_changed(self, customer: CustomerKey, now_us: int) -> None:
        """Enqueue the debounced `customer.webhook` job for this customer."""
        if self.endpoints:
            self.jobs.enqueue(customer, now_us)

    def to_json(self) -> JsonObject:
        return {
            "endpoints": [e.to_json() for e in self.endpoints],
            "pending_jobs": len(self.jobs),
            "deliveries": [d.to_json() for d in self.deliveries[-1000:]],
            "faults": self.faults.to_json(),
        }


def customer_state(hub: Hub, customer: CustomerKey) -> JsonObject:
    """Polar's `CustomerState`, as far as meters go."""
    customer_id, external_id = hub.customers.describe(customer)
    real = hub.customers.get(customer_id) if customer_id else None
    meters = []
    for meter in hub.meters.values():
        row = hub.public.rows.get((customer, meter.id))
        if row is None or not row.activated:
            continue
        meters.append(
            {
                "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{customer}:{meter.id}")),
                "created_at": iso(row.created_at_us),
                "modified_at": None if row.modified_at_us is None else iso(row.modified_at_us),
                "meter_id": meter.id,
                "consumed_units": row.consumed,
                "credited_units": row.credited,
                "balance": row.credited - row.consumed,
            }
        )
    return {
        "id": customer_id,
        "external_id": external_id,
        "created_at": None if real is None else iso(real.created_at_us),
        "metadata": {},
        "active_subscriptions": _periods(hub, customer),
        "granted_benefits": [],
        "active_meters": meters,
    }


def _periods(hub: Hub, customer: CustomerKey) -> list[JsonObject]:
    """The customer's cycles as Polar's active subscriptions show them: one per reset instant,
    its `current_period_start` the reset and its `meters` the meters it reset."""
    by_start: dict[int, list[str]] = {}
    for (who, meter_id), reset in hub.public.resets.items():
        if who == customer:
            by_start.setdefault(reset.at_us, []).append(meter_id)
    periods: list[JsonObject] = []
    for start, meter_ids in sorted(by_start.items()):
        meters = []
        for meter_id in sorted(meter_ids):
            row = hub.public.rows.get((customer, meter_id))
            consumed, credited = (row.consumed, row.credited) if row is not None else (0.0, 0)
            meters.append({"meter_id": meter_id, "consumed_units": consumed,
                           "credited_units": credited, "amount": 0})  # fmt: skip
        periods.append(
            {
                "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{customer}:period:{start}")),
                "current_period_start": iso(start),
                "meters": meters,
            }
        )
    return periods


def run_due(hub: Hub, now_us: int) -> None:
    """Build the due state-changed messages, then start the due delivery attempts."""
    hooks = hub.webhooks
    for at_us, customer in hooks.jobs.due(now_us):
        body = json.dumps(
            {"type": "customer.state_changed", "timestamp": iso(at_us),
             "data": customer_state(hub, customer)},
            separators=(",", ":"),
        ).encode()  # fmt: skip
        for endpoint in hooks.endpoints:
            message_id = f"msg_{uuid.uuid4().hex}"
            hooks.deliveries.append(Delivery(message_id, endpoint, body, at_us))
            hub.counters["webhooks_created"] += 1
    for delivery in hooks.deliveries:
        if delivery.outcome == "pending" and delivery.due_us <= now_us:
            _attempt(hub, delivery, now_us)


def _attempt(hub: Hub, delivery: Delivery, now_us: int) -> None:
    faults = hub.webhooks.faults
    if delivery.attempt == 0 and faults.drop > 0:
        faults.drop -= 1
        delivery.outcome = "dropped"
        hub.counters["webhooks_dropped"] += 1
        return
    if delivery.attempt == 0 and not delivery.held and faults.delay_count > 0:
        faults.delay_count -= 1
        delivery.held = True
        delivery.due_us = now_us + faults.delay_us
        return
    delivery.outcome = "sending"
    task = asyncio.get_running_loop().create_task(_send(hub, delivery))
    hub.webhooks._tasks.add(task)
    task.add_done_callback(hub.webhooks._tasks.discard)


async def _send(hub: Hub, delivery: Delivery) -> None:
    hooks = hub.webhooks
    if hooks._client is None:
        hooks._client = httpx.AsyncClient(timeout=TIMEOUT_S)
    timestamp = hub.now_us() // SECOND_US
    headers = {
        "content-type": "application/json",
        "webhook-id": delivery.message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(
            delivery.endpoint.secret, delivery.message_id, timestamp, delivery.body
        ),
    }
    delivery.attempt += 1
    try:
        response = await hooks._client.post(
            delivery.endpoint.url, content=delivery.body, headers=headers
        )
        ok = 200 <= response.status_code < 300
        why = str(response.status_code)
    except httpx.HTTPError as exc:
        ok, why = False, type(exc).__name__
    if ok:
        delivery.outcome = "delivered"
        hub.counters["webhooks_delivered"] += 1
        log.info("webhook %s delivered to %s", delivery.message_id, delivery.endpoint.url)
        return
    hub.counters["webhooks_failed_attempts"] += 1
    if delivery.attempt > MAX_RETRIES:
        delivery.outcome = "failed"
        log.info("webhook %s failed for good (%s)", delivery.message_id, why)
        return
    delivery.outcome = "pending"
    delivery.due_us = hub.now_us() + backoff_us(delivery.attempt)
    log.info(
        "webhook %s attempt %d failed (%s), retrying", delivery.message_id, delivery.attempt, why
    )


async def close(hub: Hub) -> None:
    if hub.webhooks._client is not None:
        await hub.webhooks._client.aclose()
        hub.webhooks._client = None
