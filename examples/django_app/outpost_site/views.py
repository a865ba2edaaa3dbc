"""`GET /generate`: one metered request for the customer named in `X-Customer-Id` (or
`?customer=`). The balance is read first; an exhausted balance answers 402, anything else tracks
one `api_call` event and does the work."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse  # type: ignore[import-untyped]

from outpost_sync import NotReady, RedisUnavailable

from . import metering


def generate(request: HttpRequest) -> JsonResponse:
    if request.method != "GET":
        return JsonResponse({"error": "use GET"}, status=405)
    customer = request.headers.get("X-Customer-Id") or request.GET.get("customer")
    if not customer:
        return JsonResponse(
            {"error": "name the customer: X-Customer-Id header or ?customer="}, status=400
        )
    outpost, meter_id = metering.outpost, metering.METER_ID
    try:
        balance = outpost.balance(meter_id, external_customer_id=customer)
        if balance.balance <= 0:
            body = {
                "error": "usage limit reached: buy more credits",
                "customer": customer,
                "balance": balance.balance,
                "credited": balance.credited,
                "consumed": balance.consumed,
            }
            return JsonResponse(body, status=402)
        outpost.track("api_call", external_customer_id=customer, metadata={"route": "generate"})
        # track() has already updated this instance's copy: no network call here.
        after = outpost.balance(meter_id, external_customer_id=customer)
    except NotReady as exc:  # Polar's first snapshot of this customer did not arrive in time
        response = JsonResponse({"error": f"usage metering is not ready: {exc}"}, status=503)
        response["Retry-After"] = "1"
        return response
    except RedisUnavailable as exc:  # nothing was tracked; the request was not served
        response = JsonResponse({"error": f"usage metering is unavailable: {exc}"}, status=503)
        response["Retry-After"] = "1"
        return response
    return JsonResponse({"customer": customer, "result": "generated", "balance": after.balance})
