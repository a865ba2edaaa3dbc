"""The one scenario every example app must pass, whatever its framework's test client."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from outpost_core import Balance
from outpost_core._webhook_signature import secret_key, sign
from outpost_emulator import Emulator
from outpost_sync import Outpost
from tests.support.waiting import wait_until

# (path, headers) -> (status, JSON body)
Get = Callable[[str, dict[str, str]], tuple[int, Any]]
# customer -> the app's own Outpost balance (warm read, no request to Polar)
ReadBalance = Callable[[str], Balance]


def balance_reader(outpost: Outpost, meter_id: str) -> ReadBalance:
    """ReadBalance for an app that holds a sync ``Outpost``."""
    return lambda customer: outpost.balance(meter_id, external_customer_id=customer)


def serves_until_the_credits_run_out(
    get: Get, emulator: Emulator, meter_id: str, read_balance: ReadBalance
) -> None:
    emulator.grant_credits(meter_id, 3, external_customer_id="alice")

    status, body = get("/generate", {})
    assert status == 400 and "X-Customer-Id" in body["error"]

    # Each request tracks one event; the balance drops at once, without waiting for Polar.
    assert get("/generate", {"X-Customer-Id": "alice"}) == (
        200,
        {"customer": "alice", "result": "generated", "balance": 2},
    )
    status, body = get("/generate?customer=alice", {})  # the query parameter works too
    assert (status, body["balance"]) == (200, 1)
    status, body = get("/generate", {"X-Customer-Id": "alice"})
    assert (status, body["balance"]) == (200, 0)

    status, body = get("/generate", {"X-Customer-Id": "alice"})
    assert status == 402
    assert body["error"].startswith("usage limit reached")
    assert (body["balance"], body["credited"], body["consumed"]) == (0, 3, 3)

    # A customer without credits is refused from the first request.
    status, body = get("/generate", {"X-Customer-Id": "bob"})
    assert (status, body["balance"], body["credited"]) == (402, 0, 0)

    # Polar counts exactly the served requests (refused ones tracked nothing).
    wait_until(
        lambda: (
            emulator.customer_meter(meter_id, external_customer_id="alice")["consumed_units"] == 3
        ),
        "Polar receiving the three events",
    )

    # Buying credits reaches the app through Polar's snapshot push: it serves again.
    emulator.grant_credits(meter_id, 2, external_customer_id="alice")
    wait_until(lambda: read_balance("alice").credited == 5, "the credit grant reaching the app")
    status, body = get("/generate", {"X-Customer-Id": "alice"})
    assert (status, body["balance"]) == (200, 1)
    wait_until(
        lambda: emulator.customer_meter(meter_id, external_customer_id="alice")["balance"] == 1,
        "Polar agreeing on the balance",
    )


WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"the example's webhook secret").decode()
# (path, body, headers) -> status
Post = Callable[[str, bytes, dict[str, str]], int]


def signed(body: bytes, message_id: str, secret: str = WEBHOOK_SECRET) -> dict[str, str]:
    """The Standard Webhooks headers Polar sends with ``body``."""
    stamp = int(time.time())
    return {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": sign(secret_key(secret), message_id, stamp, body),
    }


def answers_webhooks(post: Post) -> None:
    """The app's webhook endpoint (POLAR_WEBHOOK_SECRET set): a forged delivery is refused, a
    genuine one taken (once the configuration is known), and taken once."""
    state = {"id": str(uuid.uuid4()), "external_id": "nobody", "active_meters": []}
    body = json.dumps({"type": "customer.state_changed", "data": state}).encode()
    message_id = f"msg_{uuid.uuid4().hex}"
    forged = {**signed(body, message_id), "webhook-signature": "v1,AAAA"}
    assert post("/polar/webhooks", body, forged) == 401
    statuses: list[int] = []

    def answered() -> bool:
        statuses.append(post("/polar/webhooks", body, signed(body, message_id)))
        return statuses[-1] != 503  # 503: no configuration yet, Polar would deliver it again

    wait_until(answered, "the configuration the webhook needs")
    assert statuses[-1] == 204
    assert post("/polar/webhooks", body, signed(body, message_id)) == 204  # a retry: taken already
