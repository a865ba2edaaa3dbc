"""`GET /generate`: one metered request for the customer named in `X-Customer-Id` (or
`?customer=`). An estimate of its usage (one unit) is reserved first, exactly across every
instance; a balance that does not cover it answers 402, anything else does the work and commits
the actual usage (one `api_call` event).

`POST /polar/webhooks`: the endpoint to register in Polar's webhook settings (the public-API mode:
Polar pushes each customer's new figures there); its secret goes in POLAR_WEBHOOK_SECRET."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse  # type: ignore[import-untyped]
from django.views.decorators.csrf import csrf_exempt  # type: ignore[import-untyped]

from outpost_sync import InsufficientBalance, InvalidWebhook, NotReady, RedisUnavailable

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
        with outpost.reserve(meter_id, 1, external_customer_id=customer) as reservation:
            # ... the work goes here; then record what it actually used:
            reservation.commit("api_call", metadata={"route": "generate"})
        # commit() has already updated this instance's copy: no network call here.
        after = outpost.balance(meter_id, external_customer_id=customer)
    except InsufficientBalance:
        balance = outpost.balance(meter_id, external_customer_id=customer)
        body = {
            "error": "usage limit reached: buy more credits",
            "customer": customer,
            "balance": balance.balance,
            "credited": balance.credited,
            "consumed": balance.consumed,
        }
        return JsonResponse(body, status=402)
    except NotReady as exc:  # Polar's first snapshot of this customer did not arrive in time
        response = JsonResponse({"error": f"usage metering is not ready: {exc}"}, status=503)
        response["Retry-After"] = "1"
        return response
    except RedisUnavailable as exc:  # nothing was tracked; the request was not served
        response = JsonResponse({"error": f"usage metering is unavailable: {exc}"}, status=503)
        response["Retry-After"] = "1"
        return response
    return JsonResponse({"customer": customer, "result": "generated", "balance": after.balance})


@csrf_exempt  # Polar signs its deliveries (Standard Webhooks): the signature is the check
def polar_webhooks(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return HttpResponse(status=405)
    try:
        status = metering.outpost.handle_webhook(request.body, dict(request.headers))
    except InvalidWebhook:  # not signed with our secret (or replayed much later): not Polar
        return HttpResponse(status=401)
    except RedisUnavailable:  # not taken: Polar delivers it again
        return HttpResponse(status=503)
    return HttpResponse(status=status)
