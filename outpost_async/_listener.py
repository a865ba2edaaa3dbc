"""The async subscriber's read of its subscription, straight from the socket.

Every ``track()`` publishes its change, and its echo comes back to the instance that made it on
its own subscription. Read through redis-py, each message costs the event loop its health check,
retry wrapper, timeout and a task switch: about 15 % of what an async ``track()`` costs here.
Once subscribed, the subscription's transport is read here instead: hiredis parses the replies
as the bytes arrive (the connection's own reader, so a reply begun is finished), an expected
echo is dropped there and then (``drop``), and the subscriber task wakes only for the rest.

redis-py keeps the connection (it connected and subscribed it, and writes later (un)subscribes
on it); the health check redis-py would make on a quiet subscription is made here, and its
answer dropped as redis-py drops it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from outpost_io.pubsub import no_whole_reply

_HEALTH_CHECK = "outpost-health-check"


class PushListener(asyncio.Protocol):
    """The replies of one subscribed connection, buffered until the subscriber reads them."""

    def __init__(
        self,
        connection: Any,
        transport: asyncio.Transport,
        reader: Any,
        drop: Callable[[Any], bool] | None,
    ) -> None:
        self._connection = connection
        self._transport = transport
        self._reader = reader
        self._drop = drop
        self._stream_protocol = transport.get_protocol()  # redis-py's, told when it closes
        self._loop = asyncio.get_running_loop()
        self._replies: list[Any] = []
        self._waiter: asyncio.Future[None] | None = None
        self._failure: BaseException | None = None
        interval = getattr(connection, "health_check_interval", 0) or 0
        self._interval: float = interval
        self._next_check = self._loop.time() + interval
        self._check_replies: tuple[Any, ...] = (
            [b"pong", _HEALTH_CHECK.encode()],
            ["pong", _HEALTH_CHECK],
            _HEALTH_CHECK.encode(),
            _HEALTH_CHECK,
        )
        transport.set_protocol(self)
        stream = getattr(connection, "_reader", None)
        leftover = getattr(stream, "_buffer", None)
        if leftover:  # bytes redis-py's stream read from the socket but nobody parsed yet
            data = bytes(leftover)
            leftover.clear()
            self.data_received(data)
        else:
            self._take_whole_replies()

    @classmethod
    def take_over(cls, pubsub: Any, drop: Callable[[Any], bool] | None) -> PushListener | None:
        """Read ``pubsub``'s connection from here on; None where it cannot be (no hiredis, no
        connection yet, a redis-py this does not know): redis-py reads it then."""
        connection = pubsub.connection
        reader = getattr(getattr(connection, "_parser", None), "_reader", None)
        transport = getattr(getattr(connection, "_writer", None), "transport", None)
        if not hasattr(reader, "gets") or not isinstance(transport, asyncio.Transport):
            return None
        if transport.is_closing():
            return None
        return cls(connection, transport, reader, drop)

    def reads(self, connection: Any) -> bool:
        """Whether this reads ``connection`` as it is now (redis-py may have reconnected it)."""
        writer = getattr(connection, "_writer", None)
        return connection is self._connection and getattr(writer, "transport", None) is (
            self._transport
        )

    async def read(self, timeout: float) -> list[Any]:
        """Every reply that came, waiting up to ``timeout`` seconds for the first; raises
        redis-py's ConnectionError once the connection is closed."""
        if not self._replies and self._failure is None:
            self._check_health()
            waiter = self._waiter = self._loop.create_future()
            timer = self._loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        replies, self._replies = self._replies, []
        if not replies and self._failure is not None:
            raise RedisConnectionError(f"the subscription's connection closed: {self._failure}")
        return replies

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        self._take_whole_replies()
        if self._interval:
            self._next_check = self._loop.time() + self._interval  # it is alive

    def eof_received(self) -> bool | None:
        return None  # the transport closes, then connection_lost

    def connection_lost(self, exc: Exception | None) -> None:
        self._failure = exc or EOFError("closed by the server")
        if self._waiter is not None:
            _wake(self._waiter)
        with contextlib.suppress(Exception):
            self._stream_protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self._stream_protocol.pause_writing()  # redis-py's writes wait for the drain

    def resume_writing(self) -> None:
        self._stream_protocol.resume_writing()

    # -- internals -------------------------------------------------------------------------------

    def _take_whole_replies(self) -> None:
        drop, replies = self._drop, self._replies
        while True:
            try:
                reply = self._reader.gets()
            except Exception as exc:  # not RESP: nothing after it can be trusted
                self._failure = exc
                self._transport.abort()
                break
            if no_whole_reply(reply):
                break
            if isinstance(reply, RedisConnectionError):
                self._failure = reply
                self._transport.abort()
                break
            if drop is not None and drop(reply):
                continue
            if reply in self._check_replies:
                continue
            replies.append(reply)
        if (replies or self._failure is not None) and self._waiter is not None:
            _wake(self._waiter)

    def _check_health(self) -> None:
        """A PING on a quiet subscription, as redis-py sends one: a connection that died
        without a word fails the write, and so the read."""
        if not self._interval or self._loop.time() < self._next_check:
            return
        self._next_check = self._loop.time() + self._interval
        self._transport.write(b"".join(self._connection.pack_command("PING", _HEALTH_CHECK)))


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
