"""One Redis connection that every task of the async driver writes its commands to as they come.

redis-py's asyncio client spends most of a short command's cost in Python around the socket
(its retry wrapper, timeouts, a task switch per read): about 60 % of an async ``track()``'s CPU
here. Redis answers the commands of one connection in the order they arrived, so the replies of
many tasks can share one connection: each command is packed by hiredis and written at once when
nothing is in flight, else with the others of the same loop turn in one write; each reply,
parsed by hiredis as bytes arrive, completes the oldest command waiting. A task then pays one
future and one wake-up for its command, and 64 tasks at once pay a few writes and reads instead
of 64 round trips.

The connection comes from the client's own pool, so redis-py connects it as the application
configured it (address, TLS, AUTH, SELECT, RESP3, client name); then this module reads its
transport directly. It is used only with hiredis; without it, :class:`CommandBatches` keeps
redis-py's pipelines.

A connection that closes, times out (the client's ``socket_timeout``, else
:data:`STALLED_AFTER`) or turns read-only (a primary demoted under Sentinel) fails every command
waiting with :class:`LineLost`; the caller runs them again through redis-py, whose retries and
reconnection apply, as redis-py's own retry would have run them again. Every command sent here
is safe to run twice: scripts are idempotent by event id, hash reads are reads, and the entries
of an outbox read whose reply was lost wait in this consumer's pending list until they are
claimed (``claim_idle``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ReadOnlyError

try:
    import hiredis
    from redis._parsers.base import BaseParser
except ImportError:  # pragma: no cover - hiredis is an extra; without it redis-py does it all
    hiredis = None  # type: ignore[assignment,unused-ignore]


class LineLost(RedisConnectionError):
    """The shared connection failed before this command's reply: run it again elsewhere."""


STALLED_AFTER = 30.0
"""Seconds without the reply to the oldest command waiting after which the shared connection is
given up, where the client sets no ``socket_timeout``."""

_INCOMPLETE = object()  # hiredis's "no whole reply buffered yet" (False is a RESP3 reply)


def available() -> bool:
    return hiredis is not None


class MultiplexedConnection(asyncio.Protocol):
    """Commands in, replies out, in order, on one connection taken from ``client``'s pool."""

    def __init__(self, client: Redis, connection: Any, transport: asyncio.Transport) -> None:
        self._client = client
        self._connection = connection
        self._transport = transport
        self._stream_protocol = transport.get_protocol()  # redis-py's, told when the socket closes
        self._loop = asyncio.get_running_loop()
        self._callbacks: dict[Any, Callable[..., Any]] = dict(client.response_callbacks)
        encoder = connection.encoder
        options: dict[str, Any] = {
            "protocolError": InvalidResponse,
            "replyError": BaseParser.parse_error,
            "notEnoughData": _INCOMPLETE,
        }
        if encoder.decode_responses:
            options["encoding"] = encoder.encoding
            options["errors"] = encoder.encoding_errors
        self._reader = hiredis.Reader(**options)
        # hiredis packs a command in a tenth of redis-py's time, and the same bytes for what
        # this driver sends (str, bytes and int arguments, UTF-8 text); anything else is
        # packed by redis-py, as it would have been.
        self._pack_slowly = connection.pack_command
        self._fast_packing = (
            encoder.encoding.lower().replace("-", "").replace("_", ""),
            encoder.encoding_errors,
        ) == ("utf8", "strict")
        # A reply that never comes (a connection dead without a word) would hold up every task:
        # without the client's socket_timeout, one far longer than any script of ours runs.
        self._timeout: float = connection.socket_timeout or STALLED_AFTER
        # Each command waiting for its reply: its future, its reply callback, when it was sent.
        self._waiting: collections.deque[tuple[asyncio.Future[Any], Any, float]] = (
            collections.deque()
        )
        self._outgoing: list[bytes] = []
        self._paused = False
        self._watchdog: asyncio.TimerHandle | None = None
        self.lost = False
        transport.set_protocol(self)

    @classmethod
    async def open(cls, client: Redis) -> MultiplexedConnection | None:
        """A connection of ``client``'s pool, connected by redis-py, read from here on; None
        where its transport cannot be taken over (then redis-py keeps doing the work)."""
        pool = client.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call,unused-ignore]
        writer = getattr(connection, "_writer", None)
        transport = getattr(writer, "transport", None)
        if not isinstance(transport, asyncio.Transport) or not hasattr(connection, "encoder"):
            await pool.release(connection)  # pragma: no cover - a redis-py we do not know
            return None  # pragma: no cover
        return cls(client, connection, transport)

    def send(self, command: tuple[Any, ...], parsed: bool = True) -> asyncio.Future[Any]:
        """The future of ``command``'s reply (its error, for an error reply), made by
        redis-py's reply callback for the command unless not ``parsed``. Raises what redis-py
        raises for arguments it cannot send, and sends nothing then."""
        if self.lost:
            raise LineLost("the shared Redis connection is closed")
        packed = self._packed(command)
        future = self._loop.create_future()
        idle = not self._waiting
        if idle:
            self._arm(self._timeout)
        callback = self._callbacks.get(command[0]) if parsed else None
        self._waiting.append((future, callback, self._loop.time()))
        if idle and not self._paused:  # nothing in flight: at once (a lone task waits for no one)
            self._transport.write(packed)
            return future
        if not self._outgoing and not self._paused:
            self._loop.call_soon(self._flush)  # with the others of this loop turn
        self._outgoing.append(packed)
        return future

    def _packed(self, command: tuple[Any, ...]) -> bytes:
        name = command[0]
        if (
            self._fast_packing
            and type(name) is str
            and " " not in name
            and float not in map(type, command)
        ):
            with contextlib.suppress(TypeError):
                return hiredis.pack_command(command)  # type: ignore[no-any-return]
        return b"".join(self._pack_slowly(*command))

    async def close(self) -> None:
        """Close the connection (waiting commands fail with :class:`LineLost`) and give it back
        to the pool, which reconnects it before its next use."""
        if not self.lost:
            self._transport.close()
        with contextlib.suppress(Exception):
            await self._connection.disconnect()
        await self._client.connection_pool.release(self._connection)

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiting = self._waiting
        while True:
            try:
                reply = reader.gets()
            except InvalidResponse as exc:  # not RESP: nothing after it can be trusted
                self._fail(exc)
                return
            if reply is _INCOMPLETE:
                return
            if not waiting:  # a RESP3 push no command asked for: nothing waits for it
                continue
            future, callback, _ = waiting.popleft()
            if isinstance(reply, ReadOnlyError):  # a demoted primary: redis-py reconnects
                waiting.appendleft((future, callback, 0.0))
                self._fail(reply)
                return
            if future.done():  # its caller was cancelled; the reply is dropped
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            elif callback is None:
                future.set_result(reply)
            else:
                try:
                    future.set_result(callback(reply))
                except Exception as exc:  # a reply redis-py's callback cannot read
                    future.set_exception(exc)

    def eof_received(self) -> bool | None:
        return None  # the transport closes, then connection_lost

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True  # nothing to abort
        self._fail(exc)
        with contextlib.suppress(Exception):
            self._stream_protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._outgoing:
            self._flush()

    # -- internals -------------------------------------------------------------------------------

    def _flush(self) -> None:
        if self._paused or self.lost or not self._outgoing:
            return
        data = b"".join(self._outgoing)
        self._outgoing = []
        self._transport.write(data)

    def _arm(self, delay: float) -> None:
        if self._watchdog is None:
            self._watchdog = self._loop.call_later(delay, self._check_timeout)

    def _check_timeout(self) -> None:
        self._watchdog = None
        if not self._waiting:
            return
        overdue = self._loop.time() - self._waiting[0][2] - self._timeout
        if overdue >= 0:
            self._fail(TimeoutError(f"no reply from Redis within {self._timeout} s"))
        else:
            self._arm(-overdue)

    def _fail(self, exc: BaseException | None) -> None:
        """The connection is done for: every command waiting fails, to be run elsewhere."""
        if not self.lost:
            self.lost = True
            self._transport.abort()
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._outgoing = []
        reason = f"the shared Redis connection failed: {exc or 'closed'}"
        while self._waiting:
            future, _, _ = self._waiting.popleft()
            if not future.done():
                future.set_exception(LineLost(reason))
