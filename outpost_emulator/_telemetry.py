"""The telemetry relay, `POST /v1/outpost/telemetry/v1/{metrics,traces}` (protocol §2.3).

Polar forwards OTLP to Logfire; the emulator keeps the payloads for tests to read.
"""

from __future__ import annotations

import base64
import logging

from starlette.requests import Request
from starlette.responses import Response

from outpost_emulator._errors import denied_response
from outpost_emulator._http import hub_of
from outpost_emulator._model import JsonObject
from outpost_emulator._state import Hub

log = logging.getLogger("outpost_emulator")
MAX_KEPT = 1000


async def telemetry_endpoint(request: Request) -> Response:
    hub = hub_of(request)
    hub.counters["http_telemetry"] += 1
    denied = hub.tokens.check(request.headers, {"events:write"})
    if denied is not None:
        return denied_response(denied)
    signal = request.path_params["signal"]
    if signal not in ("metrics", "traces"):
        return Response(status_code=404)
    body = await request.body()
    content_type = request.headers.get("content-type", "")
    hub.telemetry.append(
        {
            "signal": signal,
            "content_type": content_type,
            "size": len(body),
            "received_at": hub.now_us(),
            "body_base64": base64.b64encode(body).decode(),
        }
    )
    del hub.telemetry[:-MAX_KEPT]
    log.info("telemetry: %s, %d bytes", signal, len(body))
    # An empty Export*ServiceResponse is an empty protobuf message (or `{}` in OTLP/JSON).
    if "json" in content_type:
        return Response(b"{}", media_type="application/json")
    return Response(b"", media_type="application/x-protobuf")


def telemetry_dump(hub: Hub) -> JsonObject:
    return {
        "metrics": [t for t in hub.telemetry if t["signal"] == "metrics"],
        "traces": [t for t in hub.telemetry if t["signal"] == "traces"],
    }
