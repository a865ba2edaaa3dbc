"""A Flask app that meters one endpoint with Outpost.

`GET /generate` serves one request for the customer named in the `X-Customer-Id` header (or the
`customer` query parameter): it reserves an estimate of the request's usage (one unit), answers
402 when the available balance does not cover it, and otherwise does the work and commits the
actual usage (one `api_call` event). The reservation is exact across every instance and process
sharing the Redis: two requests cannot both take the customer's last unit. Run it with
`flask --app app run` from this folder (see README.md).

`POST /polar/webhooks` is the endpoint to register in Polar's webhook settings (the public-API
mode: Polar pushes each customer's new figures there, so balances follow Polar without waiting
for a poll); its secret goes in POLAR_WEBHOOK_SECRET.

Configuration comes from the environment: POLAR_ACCESS_TOKEN, POLAR_SERVER_URL, REDIS_URL and
POLAR_WEBHOOK_SECRET (read by Outpost itself) and OUTPOST_METER_ID, the meter the balance is read
from.
"""

from __future__ import annotations

import atexit
import os

from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue

from outpost_sync import InsufficientBalance, InvalidWebhook, NotReady, Outpost, RedisUnavailable

METER_ID = os.environ.get("OUTPOST_METER_ID", "")
if not METER_ID:
    raise RuntimeError("set OUTPOST_METER_ID to the id of the meter to read balances from")

# One Outpost per process, shared by every request and thread: its in-memory copy is what makes
# a warm balance() free. It starts its background work on first use.
outpost = Outpost()
atexit.register(outpost.close)  # deliver what is still queued before the process exits

app = Flask(__name__)


@app.get("/generate")
def generate() -> ResponseReturnValue:
    customer = request.headers.get("X-Customer-Id") or request.args.get("customer")
    if not customer:
        return jsonify(error="name the customer: X-Customer-Id header or ?customer="), 400
    try:
        # Hold the estimate; released on an exception (or after a minute if the process dies).
        with outpost.reserve(METER_ID, 1, external_customer_id=customer) as reservation:
            # ... the work goes here; then record what it actually used:
            reservation.commit("api_call", metadata={"route": "generate"})
        # commit() has already updated this instance's copy: no network call here.
        after = outpost.balance(METER_ID, external_customer_id=customer)
    except InsufficientBalance:
        balance = outpost.balance(METER_ID, external_customer_id=customer)
        body = {
            "error": "usage limit reached: buy more credits",
            "customer": customer,
            "balance": balance.balance,
            "credited": balance.credited,
            "consumed": balance.consumed,
        }
        return jsonify(body), 402
    except NotReady as exc:  # Polar's first snapshot of this customer did not arrive in time
        return jsonify(error=f"usage metering is not ready: {exc}"), 503, {"Retry-After": "1"}
    except RedisUnavailable as exc:  # nothing was tracked; the request was not served
        return jsonify(error=f"usage metering is unavailable: {exc}"), 503, {"Retry-After": "1"}
    return jsonify(customer=customer, result="generated", balance=after.balance)


@app.post("/polar/webhooks")
def polar_webhooks() -> ResponseReturnValue:
    try:
        status = outpost.handle_webhook(request.get_data(), dict(request.headers))
    except InvalidWebhook:  # not signed with our secret (or replayed much later): not Polar
        return "", 401
    except RedisUnavailable:  # not taken: Polar delivers it again
        return "", 503
    return "", status
