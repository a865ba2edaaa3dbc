"""The WebSocket to Polar: wsproto's sans-IO client, JSON frames, keepalive and reconnection.

The link owns no socket. It says when it wants a connection (:meth:`Link.wants_connection`), turns
the driver's bytes into Polar's messages, and queues bytes for the driver to send. Reconnection
backs off exponentially with jitter drawn from the injected generator; a connection that goes
quiet for ``dead_after`` seconds despite pings is given up and replaced.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from ._backoff import backoff
from ._peer import Unreadable, peer_json, printable
from ._random import Random
from .errors import UsageError

PATH = "/v1/outpost/"


class LinkState(enum.Enum):
    DISCONNECTED = "disconnected"  #: no connection; one is wanted at ``retry_at``
    CONNECTING = "connecting"  #: the driver is opening the TCP (and TLS) connection
    HANDSHAKING = "handshaking"  #: the upgrade request is out; waiting for 101
    OPEN = "open"  #: messages flow
    CLOSED = "closed"  #: closed for good (the client is closing)


@attrs.frozen(kw_only=True)
class Target:
    host: str
    port: int
    tls: bool

    @classmethod
    def of(cls, server_url: str) -> Target:
        """``http(s)://host[:port]`` → where the WebSocket lives (``ws(s)``, same host)."""
        parts = urlsplit(server_url)
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
            raise UsageError(f"server_url must be an http(s) URL, got {server_url!r}")
        tls = parts.scheme in ("https", "wss")
        return cls(host=parts.hostname, port=parts.port or (443 if tls else 80), tls=tls)


@attrs.frozen(kw_only=True)
class LinkSettings:
    ping_interval: float = 20.0
    dead_after: float = 40.0
    connect_timeout: float = 10.0
    reconnect_base: float = 0.25
    reconnect_cap: float = 30.0
    refused_delay: float = 60.0
    max_message: int = 1 << 20


class Link:
    """The WebSocket to Polar as a state machine (:class:`LinkState`): when to connect, the
    upgrade and its refusal, messages in and out, pings and a dead connection's detection.

    The driver opens the connection when :meth:`wants_connection` says so, feeds what it reads to
    :meth:`receive`, writes what :meth:`data_to_send` returns, reports :meth:`opened` and
    :meth:`failed`, and calls :meth:`tick` by :meth:`next_deadline`. A session drives it through
    :class:`~outpost_core._remote.Remote`; only tests drive it alone.
    """

    def __init__(
        self, target: Target, token: str, rng: Random, settings: LinkSettings | None = None
    ) -> None:
        self.target = target
        self.settings = settings or LinkSettings()
        self._token = token
        self._rng = rng
        self.state = LinkState.DISCONNECTED
        self.retry_at = 0.0
        self._failures = 0
        self._ws: WSConnection | None = None
        self._out = bytearray()
        self._partial: list[str] = []
        self._partial_size = 0
        self._last_heard = 0.0
        self._last_ping = 0.0
        self._since = 0.0
        self._rejection: tuple[int, bytearray] | None = None
        self.refused: str | None = None
        """Why Polar refused the upgrade (a bad token), for operators."""
        self.refused_status: int | None = None
        """The HTTP status of the last refused upgrade (404: Polar serves no ``/v1/outpost/``,
        only its public API)."""
        self.connections = 0
        self.peer_errors = 0

    @property
    def rng(self) -> Random:
        """The generator the link draws its jitter from (the session shares it)."""
        return self._rng

    # -- the driver's side --------------------------------------------------------------------

    def wants_connection(self, now: float) -> bool:
        """Whether the driver should open a connection now; it reports :meth:`opened` or
        :meth:`failed`."""
        if self.state is LinkState.DISCONNECTED and now >= self.retry_at:
            self.state = LinkState.CONNECTING
            self._since = now
            return True
        return False

    def opened(self, now: float) -> None:
        if self.state is LinkState.CLOSED:
            return  # closed while the driver was connecting: it drops the connection
        if self.state is not LinkState.CONNECTING:
            raise UsageError(f"opened() while {self.state.value}")
        self._ws = WSConnection(ConnectionType.CLIENT)
        host = self.target.host
        if self.target.port != (443 if self.target.tls else 80):
            host = f"{host}:{self.target.port}"
        self._out += self._ws.send(
            Request(
                host=host,
                target=PATH,
                extra_headers=[(b"authorization", f"Bearer {self._token}".encode())],
            )
        )
        self.state = LinkState.HANDSHAKING
        self._since = self._last_heard = now

    def failed(self, now: float, reason: str) -> None:
        """The connection could not be opened, or it broke (EOF, reset, a dead peer)."""
        if self.state is LinkState.CLOSED:
            return
        self._drop(now, reason)

    def close(self) -> None:
        """Close for good (the client is closing): a close frame when open."""
        if self.state is LinkState.OPEN and self._ws is not None:
            self._out += self._ws.send(CloseConnection(code=1000))
        self.state = LinkState.CLOSED

    def data_to_send(self) -> bytes:
        out, self._out = bytes(self._out), bytearray()
        return out

    def receive(self, data: bytes, now: float) -> list[object]:
        """Feed bytes (``b""`` is EOF); return the JSON messages that arrived, in order.

        After a protocol failure the link is DISCONNECTED: the driver closes the socket.
        """
        if self._ws is None or self.state not in (LinkState.HANDSHAKING, LinkState.OPEN):
            return []
        self._last_heard = now
        if not data:
            if self._rejection is not None:
                self._refuse(now)  # the body ended with the connection
            else:
                self._drop(now, "Polar closed the connection")
            return []
        messages: list[object] = []
        try:
            ws = self._ws
            ws.receive_data(data)
            for event in ws.events():
                self._event(event, now, messages)
                if self._ws is not ws:
                    break  # the link dropped: the rest belongs to a dead connection
        except (RemoteProtocolError, LocalProtocolError) as exc:
            self.peer_errors += 1
            self._drop(now, f"WebSocket protocol error: {exc}")
        return messages

    def _event(self, event: object, now: float, messages: list[object]) -> None:
        assert self._ws is not None
        if isinstance(event, AcceptConnection):
            self.state = LinkState.OPEN
            self._failures = 0
            self.refused = None
            self.connections += 1
            self._last_ping = now
        elif isinstance(event, RejectConnection):
            self._rejection = (event.status_code, bytearray())
            if not event.has_body:
                self._refuse(now)
        elif isinstance(event, RejectData):
            if self._rejection is not None:
                body = self._rejection[1]
                body += event.data[: max(0, _DETAIL_LIMIT - len(body))]
                if event.body_finished:
                    self._refuse(now)
        elif isinstance(event, TextMessage):
            self._partial.append(event.data)
            self._partial_size += len(event.data)
            if self._partial_size > self.settings.max_message:
                self.peer_errors += 1
                self._drop(now, "Polar sent a message over the size limit")
                return
            if event.message_finished:
                text, self._partial, self._partial_size = "".join(self._partial), [], 0
                messages.append(_decode(text))
        elif isinstance(event, BytesMessage):
            if event.message_finished:  # the protocol has only text frames
                messages.append(_Unreadable(f"binary frame of {len(event.data)} bytes"))
        elif isinstance(event, Ping):
            self._out += self._ws.send(event.response())
        elif isinstance(event, CloseConnection):
            self._out += self._ws.send(event.response())
            self._drop(now, f"Polar closed the WebSocket ({event.code})")
        elif not isinstance(event, Pong):  # pragma: no cover - wsproto has no other events
            self.peer_errors += 1

    def _refuse(self, now: float) -> None:
        """Polar answered the upgrade with an HTTP error (and its body, for the detail)."""
        assert self._rejection is not None
        status, body = self._rejection
        self._rejection = None
        self.refused_status = status
        self.refused = f"Polar refused the WebSocket with HTTP {status}{_detail(bytes(body))}"
        self._drop(now, self.refused, refused=status in (401, 403))

    def send(self, message: Mapping[str, Any]) -> bool:
        """Queue one message; ``False`` when the link is not open (nothing is queued)."""
        if self.state is not LinkState.OPEN or self._ws is None:
            return False
        text = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
        self._out += self._ws.send(TextMessage(data=text))
        return True

    def tick(self, now: float) -> None:
        """Keepalive and timeouts."""
        s = self.settings
        if self.state is LinkState.HANDSHAKING and now - self._since > s.connect_timeout:
            self._drop(now, "Polar did not answer the WebSocket upgrade")
        elif self.state is LinkState.OPEN:
            assert self._ws is not None
            if now - self._last_heard > s.dead_after:
                self._drop(now, f"no frame from Polar for {s.dead_after:g} s")
            elif now - max(self._last_heard, self._last_ping) >= s.ping_interval:
                self._last_ping = now
                self._out += self._ws.send(Ping(payload=b"outpost"))

    def next_deadline(self) -> float | None:
        s = self.settings
        if self.state is LinkState.DISCONNECTED:
            return self.retry_at
        if self.state is LinkState.HANDSHAKING:
            return self._since + s.connect_timeout
        if self.state is LinkState.OPEN:
            ping = max(self._last_heard, self._last_ping) + s.ping_interval
            return min(ping, self._last_heard + s.dead_after)
        return None

    def _drop(self, now: float, reason: str, *, refused: bool = False) -> None:
        self.last_error = reason
        self._ws = None
        self._rejection = None
        self._partial, self._partial_size = [], 0
        out = bytes(self._out) if self.state is LinkState.OPEN else b""
        self._out = bytearray(out)  # a close frame answering Polar's still goes out
        self.state = LinkState.DISCONNECTED
        self._failures += 1
        s = self.settings
        if refused:
            delay = s.refused_delay
        else:
            draw = self._rng.random()
            delay = backoff(self._failures, s.reconnect_base, s.reconnect_cap, draw)
        self.retry_at = now + delay

    last_error: str | None = None


_DETAIL_LIMIT = 500


def _detail(body: bytes) -> str:
    """Polar's reason, from an error body (``{"detail": ...}`` or text), as a suffix."""
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed = peer_json(text)
    except Unreadable:
        parsed = text
    if isinstance(parsed, Mapping) and "detail" in parsed:
        parsed = parsed["detail"]
    detail = parsed if isinstance(parsed, str) else json.dumps(parsed)
    return f": {printable(detail[:200])}" if detail else ""  # it reaches logs and the status


def _decode(text: str) -> object:
    try:
        return peer_json(text)
    except Unreadable:
        return _Unreadable(text[:200])


@attrs.frozen(slots=True)
class _Unreadable:
    """A text frame that is not JSON: kept so the session can count and log it."""

    excerpt: str
