"""A FastAPI app that meters one endpoint with Outpost (asyncio).

`GET /generate` serves one request for the customer named in the `X-Customer-Id` header (or the
`customer` query parameter): it reserves an estimate of the request's usage (one unit), exactly
across every instance and process sharing the Redis, answers 402 when the available balance does
not cover it, and otherwise does the work and commits the actual usage (one `api_call` event).
Run it with `uvicorn app:app` from this folder (see README.md).

The AsyncOutpost lives in the lifespan: created when the app starts, closed (after delivering what
is queued) when it stops. Configuration comes from the environment: POLAR_ACCESS_TOKEN,
POLAR_SERVER_URL, REDIS_URL and POLAR_WEBHOOK_SECRET (read by Outpost itself) and
OUTPOST_METER_ID. `POST /polar/webhooks` is the endpoint to register in Polar's webhook settings
(the public-API mode: Polar pushes each customer's new figures there).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response

from outpost_async import (
    AsyncOutpost,
    InsufficientBalance,
    InvalidWebhook,
    NotReady,
    RedisUnavailable,
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    meter_id = os.environ.get("OUTPOST_METER_ID", "")
    if not meter_id:
        raise RuntimeError("set OUTPOST_METER_ID to the id of the meter to read balances from")
    async with AsyncOutpost() as outpost:
        app.state.outpost = outpost
        app.state.meter_id = meter_id
        yield


app = FastAPI(lifespan=lifespan)


@app.get("/generate")
async def generate(
    request: Request,
    x_customer_id: Annotated[str | None, Header()] = None,
    customer: Annotated[str | None, Query()] = None,
) -> JSONResponse:
    outpost: AsyncOutpost = request.app.state.outpost
    meter_id: str = request.app.state.meter_id
    who = x_customer_id or customer
    if not who:
        missing = {"error": "name the customer: X-Customer-Id header or ?customer="}
        return JSONResponse(missing, status_code=400)
    unavailable = {"Retry-After": "1"}
    try:
        # Hold the estimate; released on an exception (or after a minute if the process dies).
        async with await outpost.reserve(meter_id, 1, external_customer_id=who) as reservation:
            # ... the work goes here; then record what it actually used:
            await reservation.commit("api_call", metadata={"route": "generate"})
        # commit() has already updated this instance's copy: no network call here.
        after = await outpost.balance(meter_id, external_customer_id=who)
    except InsufficientBalance:
        balance = await outpost.balance(meter_id, external_customer_id=who)
        body: dict[str, object] = {
            "error": "usage limit reached: buy more credits",
            "customer": who,
            "balance": balance.balance,
            "credited": balance.credited,
            "consumed": balance.consumed,
        }
        return JSONResponse(body, status_code=402)
    except NotReady as exc:  # Polar's first snapshot of this customer did not arrive in time
        return JSONResponse(
            {"error": f"usage metering is not ready: {exc}"}, status_code=503, headers=unavailable
        )
    except RedisUnavailable as exc:  # nothing was tracked; the request was not served
        return JSONResponse(
            {"error": f"usage metering is unavailable: {exc}"}, status_code=503, headers=unavailable
        )
    return JSONResponse({"customer": who, "result": "generated", "balance": after.balance})


@app.post("/polar/webhooks")
async def polar_webhooks(request: Request) -> Response:
    outpost: AsyncOutpost = request.app.state.outpost
    try:
        status = await outpost.handle_webhook(await request.body(), dict(request.headers))
    except InvalidWebhook:  # not signed with our secret (or replayed much later): not Polar
        return Response(status_code=401)
    except RedisUnavailable:  # not taken: Polar delivers it again
        return Response(status_code=503)
    return Response(status_code=status)
