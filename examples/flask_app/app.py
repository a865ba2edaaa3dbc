"""A Flask app that meters one endpoint with Outpost.

`GET /generate` serves one request for the customer named in the `X-Customer-Id` header (or the
`customer` query parameter): it reads the customer's balance first, answers 402 when it is
exhausted, and otherwise tracks one `api_call` event and does the work. Run it with
`flask --app app run` from this folder (see README.md).

Configuration comes from the environment: POLAR_ACCESS_TOKEN, POLAR_SERVER_URL and REDIS_URL
(read by Outpost itself) and OUTPOST_METER_ID, the meter the balance is read from.
"""

from __future__ import annotations

import atexit
import os

from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue

from outpost_sync import NotReady, Outpost, RedisUnavailable

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
        balance = outpost.balance(METER_ID, external_customer_id=customer)
        if balance.balance <= 0:
            body = {
                "error": "usage limit reached: buy more credits",
                "customer": customer,
                "balance": balance.balance,
                "credited": balance.credited,
                "consumed": balance.consumed,
            }
            return jsonify(body), 402
        outpost.track("api_call", external_customer_id=customer, metadata={"route": "generate"})
        # track() has already updated this instance's copy: no network call here.
        after = outpost.balance(METER_ID, external_customer_id=customer)
    except NotReady as exc:  # Polar's first snapshot of this customer did not arrive in time
        return jsonify(error=f"usage metering is not ready: {exc}"), 503, {"Retry-After": "1"}
    except RedisUnavailable as exc:  # nothing was tracked; the request was not served
        return jsonify(error=f"usage metering is unavailable: {exc}"), 503, {"Retry-After": "1"}
    return jsonify(customer=customer, result="generated", balance=after.balance)
