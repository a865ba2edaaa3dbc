"""`Emulator`: the emulator on a background thread, with a Python API for tests and demos."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

import uvicorn

from outpost_emulator._admin import (
    EmulatorError,
    clock_state,
    op_clock,
    op_create_meter,
    op_credits,
    op_customer_meter,
    op_customers,
    op_cycle,
    op_faults,
    op_state,
    op_telemetry,
    op_tokens,
    op_webhooks,
)
from outpost_emulator._auth import DEFAULT_SCOPES
from outpost_emulator._clock import EmulatorClock
from outpost_emulator._defaults import DEFAULT_TOKEN
from outpost_emulator._frames import MAX_FRAME_BYTES
from outpost_emulator._limits import DEFAULT_REQUESTS_PER_MINUTE
from outpost_emulator._model import JsonObject
from outpost_emulator._public import DEFAULT_RECOMPUTE_MAX_S, DEFAULT_RECOMPUTE_MIN_S
from outpost_emulator._state import Hub, TransportFinder
from outpost_emulator.app import create_app

T = TypeVar("T")


def transport_finder(server: uvicorn.Server) -> TransportFinder:
    """Finds a client's transport among uvicorn's open connections, so faults can abort it."""

    def find(client: tuple[str, int]) -> asyncio.Transport | None:
        for protocol in list(server.server_state.connections):
            found = getattr(protocol, "client", None)
            if found is not None and tuple(found) == client:
                transport = getattr(protocol, "transport", None)
                return transport if isinstance(transport, asyncio.Transport) else None
        return None

    return find


def uvicorn_config(app: Any, host: str, port: int, **extra: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ws="wsproto",  # the same WebSocket stack the SDK's core uses
        lifespan="on",
        date_header=False,  # the app dates answers with the emulator's clock (ClockDate)
        # Frames above 1 MiB must reach the app to be answered with an `error` frame.
        ws_max_size=8 * MAX_FRAME_BYTES,
        **extra,
    )


class _Server(uvicorn.Server):
    """uvicorn's server, announcing when it listens and stopping without a polling delay."""

    def __init__(self, config: uvicorn.Config, ready: threading.Event) -> None:
        super().__init__(config)
        self._ready = ready
        self._wake: asyncio.Event | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._wake = asyncio.Event()
        await super().startup(sockets=sockets)
        self._ready.set()

    async def main_loop(self) -> None:
        # uvicorn's loop, except that `request_stop` wakes it at once instead of within 0.1 s.
        assert self._wake is not None
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864_000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)
            should_exit = await self.on_tick(counter)

    def request_stop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.should_exit = True
        if loop is not None and self._wake is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._wake.set)


class Emulator:
    """A running emulator. Use `Emulator.start(...)`, ideally as a context manager.

    Every method may be called from any thread, including from inside an asyncio loop running
    in another thread; each blocks until the emulator's loop has done the work.
    """

    def __init__(self, hub: Hub, server: uvicorn.Server, thread: threading.Thread) -> None:
        self._hub = hub
        self._server = server
        self._thread = thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False
        self._token = DEFAULT_TOKEN
        self.host = "127.0.0.1"
        self.port = 0
        self.tls = False

    @classmethod
    def start(
        cls,
        port: int = 0,
        token: str = DEFAULT_TOKEN,
        clock: EmulatorClock | None = None,
        sync_delay: float = 10.0,
        *,
        rate_limit: int = DEFAULT_REQUESTS_PER_MINUTE,
        host: str = "127.0.0.1",
        scopes: Iterable[str] = DEFAULT_SCOPES,
        startup_timeout: float = 10.0,
        tls: tuple[str, str] | None = None,
        public_only: bool = False,
        recompute_delays: tuple[float, float] = (DEFAULT_RECOMPUTE_MIN_S, DEFAULT_RECOMPUTE_MAX_S),
        replica_lag: float = 0.0,
    ) -> Emulator:
        """Start uvicorn on `host:port` (0: a free port) and return once it accepts.

        `tls`, a (certificate chain file, private key file) pair, serves HTTPS and `wss://`.
        `public_only` serves Polar's public API as it is (no `/v1/outpost/`; customer meters
        recomputed `recompute_delays` = (minimum, maximum) seconds after ingests, as Polar's
        debounced job; quantities read a replica `replica_lag` seconds behind)."""
        hub = Hub(
            clock=clock,
            token=token,
            scopes=scopes,
            sync_delay=sync_delay,
            rate_limit=rate_limit,
            public_only=public_only,
            recompute_delays=recompute_delays,
            replica_lag=replica_lag,
        )
        certificates = {"ssl_certfile": tls[0], "ssl_keyfile": tls[1]} if tls else {}
        config = uvicorn_config(
            create_app(hub=hub),
            host,
            port,
            log_config=None,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
            **certificates,
        )
        ready = threading.Event()
        server = _Server(config, ready)
        hub.transport_finder = transport_finder(server)
        loop_box: list[asyncio.AbstractEventLoop] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            loop_box.append(loop)
            try:
                loop.run_until_complete(server.serve())
            except SystemExit:
                pass  # uvicorn exits when it cannot bind; `start` reports it
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()
                ready.set()  # never leave `start` waiting for a server that is gone

        thread = threading.Thread(target=run, name=f"outpost-emulator-{port}", daemon=True)
        emulator = cls(hub, server, thread)
        thread.start()
        if not ready.wait(startup_timeout) or not server.started:
            server.should_exit = True
            thread.join(startup_timeout)
            raise RuntimeError(f"the emulator did not start on {host}:{port}")
        emulator._loop = loop_box[0]
        emulator._token = token
        emulator.host = host
        emulator.tls = tls is not None
        emulator.port = server.servers[0].sockets[0].getsockname()[1]
        return emulator

    # Addresses -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL to give the SDK as `server_url`, e.g. http://127.0.0.1:54321."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        """The Outpost WebSocket, e.g. ws://127.0.0.1:54321/v1/outpost/."""
        return f"{'wss' if self.tls else 'ws'}://{self.host}:{self.port}/v1/outpost/"

    @property
    def token(self) -> str:
        """The token created at start (all default scopes)."""
        return self._token

    @property
    def clock(self) -> EmulatorClock:
        return self._hub.clock

    # Lifecycle -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Close every connection and stop the server thread. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if isinstance(self._server, _Server):
            self._server.request_stop(self._loop)
        else:
            self._server.should_exit = True
        self._thread.join(timeout=15)

    def __enter__(self) -> Emulator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _call(self, op: Callable[[Hub, JsonObject], T], body: JsonObject | None = None) -> T:
        if self._stopped or self._loop is None:
            raise RuntimeError("the emulator is stopped")
        if threading.get_ident() == self._thread.ident:
            raise RuntimeError("Emulator methods block; call them from outside its own loop")

        async def run() -> T:
            return op(self._hub, body or {})

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    # Time ------------------------------------------------------------------------------------

    def advance(self, seconds: float) -> JsonObject:
        """Move the clock forward; returns after the syncs and seals now due have run."""
        return self._call(op_clock, {"advance": seconds})

    def set_time(self, instant: datetime) -> JsonObject:
        if instant.tzinfo is None:
            raise ValueError("set_time needs a timezone-aware datetime")
        return self._call(op_clock, {"set": instant.isoformat()})

    def freeze(self, frozen: bool = True) -> JsonObject:
        return self._call(op_clock, {"freeze": frozen})

    def set_speed(self, speed: float) -> JsonObject:
        return self._call(op_clock, {"speed": speed})

    def clock_state(self) -> JsonObject:
        return self._call(clock_state)

    # Data ------------------------------------------------------------------------------------

    def create_meter(
        self, name: str, filter: JsonObject, aggregation: JsonObject, **fields: Any
    ) -> JsonObject:
        """Create a meter (as `POST /v1/meters/`); raises EmulatorError(422, errors) if invalid."""
        return self._call(
            op_create_meter, {"name": name, "filter": filter, "aggregation": aggregation, **fields}
        )

    def create_customer(self, external_id: str | None = None) -> JsonObject:
        return self._call(op_customers, {"external_id": external_id})

    def grant_credits(
        self,
        meter_id: str,
        units: int,
        *,
        external_customer_id: str | None = None,
        customer_id: str | None = None,
    ) -> JsonObject:
        """Credit (or, with negative units, revoke) units; pushes a snapshot to subscribers."""
        body: JsonObject = {"meter_id": meter_id, "units": units}
        body.update(_identity(external_customer_id, customer_id))
        return self._call(op_credits, body)

    def add_token(self, token: str, scopes: Iterable[str]) -> JsonObject:
        return self._call(op_tokens, {"token": token, "scopes": list(scopes)})

    def customer_meter(
        self,
        meter_id: str,
        *,
        external_customer_id: str | None = None,
        customer_id: str | None = None,
    ) -> JsonObject:
        """Polar's CustomerMeter for one customer (zeros when Polar has no row yet)."""
        body: JsonObject = {"meter_id": meter_id, **_identity(external_customer_id, customer_id)}
        return self._call(op_customer_meter, body)

    def state(self) -> JsonObject:
        return self._call(op_state)

    def cycle(
        self,
        meter_id: str,
        units: int = 0,
        *,
        rollover_units: int = 0,
        external_customer_id: str | None = None,
        customer_id: str | None = None,
    ) -> JsonObject:
        """A billing cycle: the meter resets now, then `rollover_units` and `units` are credited."""
        body: JsonObject = {"meter_id": meter_id, "units": units, "rollover_units": rollover_units}
        body.update(_identity(external_customer_id, customer_id))
        return self._call(op_cycle, body)

    def register_webhook(self, url: str, secret: str | None = None) -> JsonObject:
        """Deliver `customer.state_changed` to `url`; the answer holds the `whsec_` secret."""
        body: JsonObject = {"url": url}
        if secret is not None:
            body["secret"] = secret
        return self._call(op_webhooks, body)

    def webhooks(self) -> JsonObject:
        """Endpoints, recent deliveries (with their outcome) and webhook faults."""
        return self._call(lambda hub, _: hub.webhooks.to_json())

    def telemetry(self) -> JsonObject:
        return self._call(op_telemetry)

    # Faults ----------------------------------------------------------------------------------

    def fault_ingest_error(
        self, status: int, *, count: int = 1, retry_after: float | None = None
    ) -> JsonObject:
        """The next `count` ingests answer `status` (429 always carries Retry-After)."""
        spec: JsonObject = {"status": status, "count": count, "retry_after": retry_after}
        return self._call(op_faults, {"ingest_error": spec})

    def fault_ingest_hang(self, seconds: float, *, count: int = 1) -> JsonObject:
        """The next `count` ingests wait `seconds` (wall) before being processed normally."""
        return self._call(op_faults, {"ingest_hang": {"seconds": seconds, "count": count}})

    def fault_ingest_lose_response(self, *, count: int = 1) -> JsonObject:
        """The next `count` ingests are processed, then the connection drops unanswered."""
        return self._call(op_faults, {"ingest_lose_response": {"count": count}})

    def fault_drop_websockets(self, mode: str = "close") -> JsonObject:
        """Close every WebSocket with code 1012, or `"abort"` the TCP connections."""
        return self._call(op_faults, {"drop_websockets": mode})

    def fault_send_frames(self, frames: Iterable[str | bytes]) -> JsonObject:
        """Send these frames, as they are, on every open WebSocket (text, or bytes as binary)."""
        spec = [
            {"binary_base64": base64.b64encode(f).decode()} if isinstance(f, bytes) else {"text": f}
            for f in frames
        ]
        return self._call(op_faults, {"send_frames": spec})

    def fault_pause_syncs(self) -> JsonObject:
        return self._call(op_faults, {"syncs": "pause"})

    def fault_resume_syncs(self) -> JsonObject:
        return self._call(op_faults, {"syncs": "resume"})

    def fault_snapshot_delay(self, seconds: float) -> JsonObject:
        """Delay every snapshot reply and push by `seconds` (wall); 0 turns it off."""
        return self._call(op_faults, {"snapshot_delay": seconds})

    def fault_webhook_drop(self, *, count: int = 1) -> JsonObject:
        """The next `count` webhook deliveries are lost (never sent, never retried)."""
        return self._call(op_faults, {"webhook_drop": {"count": count}})

    def fault_webhook_delay(self, seconds: float, *, count: int = 1) -> JsonObject:
        """The next `count` webhook deliveries wait `seconds` of emulator time first."""
        return self._call(op_faults, {"webhook_delay": {"seconds": seconds, "count": count}})

    def set_replica_lag(self, seconds: float) -> JsonObject:
        """Quantities see only events ingested more than `seconds` (emulator time) ago."""
        return self._call(op_faults, {"replica_lag": seconds})

    def fault_clear(self) -> JsonObject:
        """Forget pending faults, remove the snapshot delay and resume syncs."""
        return self._call(op_faults, {"clear": True})

    def __repr__(self) -> str:
        return f"Emulator({self.url}, stopped={self._stopped})"


def _identity(external_customer_id: str | None, customer_id: str | None) -> JsonObject:
    body: JsonObject = {}
    if external_customer_id is not None:
        body["external_customer_id"] = external_customer_id
    if customer_id is not None:
        body["customer_id"] = customer_id
    return body


__all__ = ["Emulator", "EmulatorError"]
