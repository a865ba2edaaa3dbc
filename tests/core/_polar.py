"""Polar's side of the WebSocket, in memory: wsproto's server connection, no socket."""

from __future__ import annotations

import json
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto import events as ws

from outpost_core import Effect, SendBytes


class FixedRandom:
    """The injected generator: always the same draw, so backoffs are exact."""

    def __init__(self, value: float = 0.5) -> None:
        self.value = value
        self.draws = 0

    def random(self) -> float:
        self.draws += 1
        return self.value


class Peer:
    """One connection as Polar sees it: feed it the client's bytes, get its answers."""

    def __init__(self) -> None:
        self.server = WSConnection(ConnectionType.SERVER)
        self.requests: list[ws.Request] = []
        self.messages: list[Any] = []
        self.pings: list[bytes] = []
        self.pongs: list[bytes] = []
        self.closes: list[int | None] = []

    def feed(self, data: bytes) -> bytes:
        """Take bytes from the client; return what Polar answers on its own (pongs, closes)."""
        self.server.receive_data(data)
        out = b""
        for event in self.server.events():
            if isinstance(event, ws.Request):
                self.requests.append(event)
            elif isinstance(event, ws.TextMessage):
                self.messages.append(json.loads(event.data))
            elif isinstance(event, ws.Ping):
                self.pings.append(bytes(event.payload))
                out += self.server.send(event.response())
            elif isinstance(event, ws.Pong):
                self.pongs.append(bytes(event.payload))
            elif isinstance(event, ws.CloseConnection):
                self.closes.append(event.code)
        return out

    def receive(self, effects: list[Effect]) -> list[Effect]:
        """Take the bytes among a session's effects (Polar must have nothing to answer at once);
        returns the other effects."""
        rest: list[Effect] = []
        for effect in effects:
            if isinstance(effect, SendBytes):
                assert self.feed(effect.data) == b""
            else:
                rest.append(effect)
        return rest

    def accept(self) -> bytes:
        return self.server.send(ws.AcceptConnection())

    def reject(self, status: int, body: bytes | None = None, *, finished: bool = True) -> bytes:
        """Refuse the upgrade; ``finished=False`` leaves the body open (more may follow)."""
        out = self.server.send(ws.RejectConnection(status_code=status, has_body=body is not None))
        if body is not None:
            out += self.server.send(ws.RejectData(data=body, body_finished=finished))
        return out

    def reject_more(self, body: bytes, *, finished: bool = True) -> bytes:
        """More of a refusal's body."""
        return self.server.send(ws.RejectData(data=body, body_finished=finished))

    def send(self, message: Any) -> bytes:
        return self.server.send(ws.TextMessage(data=json.dumps(message)))

    def send_text(self, text: str, *, finished: bool = True) -> bytes:
        return self.server.send(ws.TextMessage(data=text, message_finished=finished))

    def send_bytes(self, data: bytes, *, finished: bool = True) -> bytes:
        return self.server.send(ws.BytesMessage(data=data, message_finished=finished))

    def ping(self, payload: bytes = b"polar") -> bytes:
        return self.server.send(ws.Ping(payload=payload))

    def pong(self, payload: bytes = b"") -> bytes:
        return self.server.send(ws.Pong(payload=payload))

    def close(self, code: int = 1000) -> bytes:
        return self.server.send(ws.CloseConnection(code=code))

    def take(self) -> list[Any]:
        out, self.messages = self.messages, []
        return out


def snapshot_message(
    request_id: str | None,
    customer: str,
    *,
    as_of: int,
    cold_until: int,
    reducers: dict[str, Any],
    credited: dict[str, float],
    **extra: Any,
) -> dict[str, Any]:
    """Polar's ``snapshot`` message for the external ``customer`` (``snap-1``); ``extra`` adds
    fields or replaces them."""
    payload = {
        "request_id": request_id,
        "snapshot_id": "snap-1",
        "external_customer_id": customer,
        "as_of": as_of,
        "cold_until": cold_until,
        "reducers": reducers,
        "credited": credited,
        **extra,
    }
    return {"type": "snapshot", "payload": payload}
