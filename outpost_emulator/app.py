"""The Starlette application: Polar's routes, the Outpost WebSocket, the admin API and its
dashboard."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
from collections.abc import AsyncIterator, Iterable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from outpost_emulator._admin import admin_endpoint
from outpost_emulator._auth import DEFAULT_SCOPES
from outpost_emulator._clock import EmulatorClock
from outpost_emulator._dashboard import ROUTES as DASHBOARD_ROUTES
from outpost_emulator._defaults import DEFAULT_TOKEN
from outpost_emulator._ingest import ingest_endpoint
from outpost_emulator._limits import DEFAULT_REQUESTS_PER_MINUTE
from outpost_emulator._meters import customer_meters_endpoint, meter_endpoint, meters_endpoint
from outpost_emulator._quantities import quantities_endpoint
from outpost_emulator._state import Hub
from outpost_emulator._telemetry import telemetry_endpoint
from outpost_emulator._webhooks import close as close_webhooks
from outpost_emulator._websocket import outpost_endpoint

log = logging.getLogger("outpost_emulator")
TICK_INTERVAL_S = 0.02  # how often (wall) the scheduler looks for due syncs and seals


class RateLimited:
    """Polar's per-organization request budget on its HTTP API (not the Outpost WebSocket and
    relay, nor the admin API): beyond it, 429 with Retry-After."""

    def __init__(self, app: ASGIApp, hub: Hub) -> None:
        self.app = app
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if (
            scope["type"] == "http"
            and path.startswith("/v1/")
            and not path.startswith("/v1/outpost/")
        ):
            wait = self.hub.rate_limit.admit()
            if wait is not None:
                self.hub.counters["http_rate_limited"] += 1
                response = JSONResponse(
                    {"error": "TooManyRequests", "detail": "Rate limit exceeded."},
                    status_code=429,
                    headers={"Retry-After": str(wait)},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class DueWorkFirst:
    """Runs due syncs and seals before every request and WebSocket upgrade, so what a client
    sees never lags the clock, whatever the scheduler task's timing."""

    def __init__(self, app: ASGIApp, hub: Hub) -> None:
        self.app = app
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            self.hub.tick()
        await self.app(scope, receive, send)


class ClockDate:
    """Every HTTP answer's ``Date`` header comes from the emulator's clock, as Polar's comes from
    Polar's: a client that compares clocks with Polar (``outpost doctor``) sees the skew a moved
    emulator clock makes."""

    def __init__(self, app: ASGIApp, hub: Hub) -> None:
        self.app = app
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def dated(message: Message) -> None:
            if message["type"] == "http.response.start":
                date = email.utils.format_datetime(self.hub.clock.now(), usegmt=True)
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"date"]
                message = {**message, "headers": [*headers, (b"date", date.encode())]}
            await send(message)

        await self.app(scope, receive, dated)


async def _scheduler(hub: Hub) -> None:
    while True:
        await asyncio.sleep(TICK_INTERVAL_S)
        try:
            hub.tick()
        except Exception:  # keep the emulator alive; the error is in the log
            log.exception("scheduler tick failed")


async def _not_served(websocket: WebSocket) -> None:
    """Polar's public API has no Outpost WebSocket: the upgrade gets a plain 404."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse({"detail": "Not Found"}, status_code=404))
    else:
        await websocket.close(code=1008)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def create_app(
    *,
    token: str = DEFAULT_TOKEN,
    clock: EmulatorClock | None = None,
    sync_delay: float = 10.0,
    scopes: Iterable[str] = DEFAULT_SCOPES,
    hub: Hub | None = None,
    rate_limit: int = DEFAULT_REQUESTS_PER_MINUTE,
    public_only: bool = False,
) -> Starlette:
    """A fresh emulator app. Its state is `app.state.hub`; run it with uvicorn, `ws="wsproto"`.
    ``rate_limit``: requests a minute Polar's API admits (0: no limit). ``public_only``: serve
    Polar's public API only (no `/v1/outpost/`); a given ``hub`` decides it instead."""
    hub = hub or Hub(
        clock=clock,
        token=token,
        scopes=scopes,
        sync_delay=sync_delay,
        rate_limit=rate_limit,
        public_only=public_only,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(_scheduler(hub))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await close_webhooks(hub)

    outpost: list[BaseRoute] = [
        WebSocketRoute("/v1/outpost/", outpost_endpoint),
        Route("/v1/outpost/telemetry/v1/{signal}", telemetry_endpoint, methods=["POST"]),
    ]
    if hub.public_only:
        outpost = [WebSocketRoute("/v1/outpost/", _not_served)]  # HTTP routes: 404 by default
    app = Starlette(
        routes=[
            Route("/v1/events/ingest", ingest_endpoint, methods=["POST"]),
            Route("/v1/meters/", meters_endpoint, methods=["GET", "POST"]),
            Route("/v1/meters/{id}", meter_endpoint, methods=["GET"]),
            Route("/v1/meters/{id}/quantities", quantities_endpoint, methods=["GET"]),
            Route("/v1/customer-meters/", customer_meters_endpoint, methods=["GET"]),
            *outpost,
            *DASHBOARD_ROUTES,  # `/` and its files
            Route("/__emulator/{name}", admin_endpoint, methods=["GET", "POST"]),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.hub = hub
    app.add_middleware(DueWorkFirst, hub=hub)
    app.add_middleware(ClockDate, hub=hub)
    app.add_middleware(RateLimited, hub=hub)
    return app
