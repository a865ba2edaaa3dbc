"""The Outpost WebSocket, `/v1/outpost/` (docs/protocol.md §1)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from starlette.websockets import WebSocket

from outpost_emulator._connections import CloseRequest, Connection, RawFrame
from outpost_emulator._errors import denied_response
from outpost_emulator._frames import (
    Frame,
    FrameError,
    counted_request,
    identity_of,
    parse_frame,
    require_request_id,
)
from outpost_emulator._http import short
from outpost_emulator._snapshots import build_snapshot, counted_ids
from outpost_emulator._state import Hub

log = logging.getLogger("outpost_emulator")


async def outpost_endpoint(websocket: WebSocket) -> None:
    hub = websocket.app.state.hub
    assert isinstance(hub, Hub)
    hub.counters["ws_upgrades"] += 1
    denied = hub.tokens.check(websocket.headers, {"events:write"})
    if denied is not None:
        hub.counters["ws_auth_rejected"] += 1
        log.info("ws: upgrade refused with %d", denied.status)
        # Refuse the upgrade with a real HTTP answer (ASGI websocket denial response).
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            await websocket.send_denial_response(denied_response(denied))
        else:
            await websocket.close(code=1008)
        return
    await websocket.accept()
    client = websocket.scope.get("client")
    client_addr = (str(client[0]), int(client[1])) if client else None

    def abort() -> bool:
        transport = (
            hub.transport_finder(client_addr) if hub.transport_finder and client_addr else None
        )
        if transport is None:
            return False
        transport.abort()
        return True

    connection = Connection(client_addr, abort)
    hub.connections.add(connection)
    log.info("ws#%d: open from %s", connection.id, client_addr)
    writer = asyncio.create_task(_write(websocket, connection))
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            hub.tick()
            connection.frames_in += 1
            handle(hub, connection, message)
    finally:
        hub.connections.remove(connection)
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await writer
        log.info("ws#%d: closed", connection.id)


async def _write(websocket: WebSocket, connection: Connection) -> None:
    while True:
        item = await connection.queue.get()
        if isinstance(item, CloseRequest):
            await websocket.close(code=item.code)
            return
        if isinstance(item, RawFrame):
            if isinstance(item.data, bytes):
                await websocket.send_bytes(item.data)
            else:
                await websocket.send_text(item.data)
        else:
            await websocket.send_text(item)
        connection.frames_out += 1


def handle(hub: Hub, connection: Connection, message: Mapping[str, Any]) -> None:
    """Answer one client frame. Bad input gets an `error` frame; it never closes the socket."""
    try:
        frame = parse_frame(message)
        log.info("ws#%d <- %s %s", connection.id, frame.type, short(frame.payload))
        if frame.type == "configuration":
            connection.send({"type": "configuration", "payload": hub.configuration_payload()})
        elif frame.type == "snapshot":
            _snapshot(hub, connection, frame)
        elif frame.type == "counted":
            _counted(hub, connection, frame)
        elif frame.type == "forget":
            identity, _ = identity_of(frame)
            connection.subscriptions.pop(identity, None)
        else:
            raise FrameError("unknown_type", f"unknown frame type {frame.type!r}", frame.request_id)
    except FrameError as exc:
        hub.counters["ws_frames_rejected"] += 1
        hub.counters[f"ws_error_{exc.code}"] += 1
        log.info("ws#%d: error %s: %s", connection.id, exc.code, exc.message)
        payload = {"request_id": exc.request_id, "code": exc.code, "message": exc.message}
        connection.send({"type": "error", "payload": payload})
    except Exception as exc:  # an emulator bug: report it, keep the socket
        hub.counters["ws_internal_errors"] += 1
        log.exception("ws#%d: failed to handle a frame", connection.id)
        payload = {"request_id": None, "code": "internal_error", "message": repr(exc)}
        connection.send({"type": "error", "payload": payload})


def _snapshot(hub: Hub, connection: Connection, frame: Frame) -> None:
    request_id = require_request_id(frame)
    identity, shown_as = identity_of(frame)
    payload = build_snapshot(hub, identity, shown_as, request_id)
    if payload is None:
        raise FrameError("unknown_customer", f"no customer {shown_as!r}", request_id)
    connection.subscriptions[identity] = shown_as
    hub.counters["snapshots_requested"] += 1
    connection.send({"type": "snapshot", "payload": payload}, hub.faults.snapshot_delay_s)


def _counted(hub: Hub, connection: Connection, frame: Frame) -> None:
    request_id, snapshot_id, event_ids = counted_request(frame)
    found = counted_ids(hub, snapshot_id, event_ids)
    if found is None:
        raise FrameError(
            "snapshot_expired",
            f"snapshot {snapshot_id!r} is unknown or expired; request a new snapshot",
            request_id,
        )
    payload = {"request_id": request_id, "snapshot_id": snapshot_id, "event_ids": found}
    connection.send({"type": "counted", "payload": payload})
