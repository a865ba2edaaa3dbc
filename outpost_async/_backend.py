"""What asyncio does for the async driver: tasks, waiting for a change, sleeping.

``outpost_sync/_backend.py`` offers the same names with threads. The driver's other modules are
written once (here, async) and the sync ones are generated from them; these two files (with the
async driver's shared connection, ``_multiplexed.py`` and ``_listener.py``) are the hand-written
difference between the drivers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, PipelineCommand, RedisCluster
from redis.exceptions import RedisError, ResponseError

from outpost_async._listener import PushListener
from outpost_async._multiplexed import LineLost, MultiplexedConnection
from outpost_async._multiplexed import available as multiplexing_available
from outpost_io.proxy import ProxyError, proxy_for
from outpost_io.pubsub import buffered_replies

_T = TypeVar("_T")
_REOPEN_AFTER = 1.0  # seconds without the shared connection after it could not be opened


def CoreLock() -> contextlib.AbstractContextManager[Any]:  # the sync twin is an RLock
    """The core is only touched from the event loop's thread: no lock is needed."""
    return contextlib.nullcontext()


def CallLimit(calls: int) -> asyncio.Semaphore:  # the sync twin: a threading semaphore
    """At most ``calls`` tasks inside at once (``async with``); the others wait their turn."""
    return asyncio.Semaphore(calls)


class Signal:
    """Wakes every waiter when the core's state changed. Waiters pass the version they saw, so a
    change between their check and their wait is never missed."""

    def __init__(self) -> None:
        self._version = 0
        self._event = asyncio.Event()

    @property
    def version(self) -> int:
        return self._version

    def fire(self) -> None:
        self._version += 1
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, version: int, timeout: float) -> None:
        if self._version != version or timeout <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)


class Worker:
    """One background task."""

    def __init__(self, name: str, target: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._task: asyncio.Task[None] = asyncio.get_running_loop().create_task(target(), name=name)

    async def stop(self, timeout: float) -> None:
        """Cancel the task; cancellation is prompt, so ``timeout`` is not needed here."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class CommandBatches:
    """Commands that many tasks send at once, sent together (auto-pipelining): the scripts, and
    the reads of state hashes.

    With hiredis, every command goes on one shared connection (:class:`MultiplexedConnection`):
    written with the others of its loop turn, its reply matched in order. A command that
    connection loses runs again through redis-py (its retries), and redis-py does the work alone
    while the connection cannot be opened (a second later it is tried again).

    Without hiredis, a call that finds fewer than ``slots`` sends in flight goes at once, alone;
    one that finds them all busy waits, and when a send returns, every call waiting goes as the
    next send, one redis-py pipeline. Either way Redis runs them in the order they were called,
    and 64 tasks tracking at once cost this process a few round trips' work instead of 64, on a
    few connections, not one each: redis-py's pool refuses more than 100.

    A waiting call that is cancelled is not sent; one cancelled once sent may still run, as any
    call cancelled while Redis runs it.
    """

    def __init__(
        self, client: Redis, slots: int = 4, most: int = 512, shared_connection: bool = True
    ) -> None:
        self._client = client
        self._slots = slots
        self._most = most
        self._in_flight = 0
        self._waiting: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._sends: set[asyncio.Task[None]] = set()
        self._line: MultiplexedConnection | None = None
        self._opening: asyncio.Task[MultiplexedConnection | None] | None = None
        self._reopen_at = 0.0
        # a cluster's commands go to the node of their keys: redis-py routes them
        self._multiplexed = (
            shared_connection and multiplexing_available() and isinstance(client, Redis)
        )

    async def execute(self, *command: Any, parsed: bool = True) -> Any:
        """``command``'s reply, or the error Redis or the connection gave it. ``parsed=False``:
        the caller reads the reply as Redis sent it, or as redis-py makes it (on the shared
        connection, redis-py's reply callback is then skipped: a stream read's costs more
        than the read)."""
        line = self._line
        if (line is not None and not line.lost) or (line := await self._open_line()) is not None:
            try:
                return await line.send(command, parsed)
            except LineLost:
                return await self._client.execute_command(*command)  # type: ignore[no-untyped-call]
        if self._slot_free():
            try:
                return await self._client.execute_command(*command)  # type: ignore[no-untyped-call]
            finally:
                self._returned()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((command, future))
        return await future

    async def scripts(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Each script's reply, or the error it met (never raised): sent at once, so they go
        together in the line's next write."""
        return list(
            await asyncio.gather(*(self.execute(*c) for c in commands), return_exceptions=True)
        )

    async def first_then_scripts(
        self,
        first: tuple[Any, ...],
        read: Callable[[Any], _T],
        commands: Sequence[tuple[Any, ...]],
    ) -> tuple[_T | BaseException, list[Any]]:
        """``first`` (its reply as Redis sent it, made into ``read(reply)``) and the scripts
        ``commands`` behind it, sent together: Redis runs the scripts while ``read`` works on the
        first reply. Each result, or the error it met (never raised)."""

        async def first_read() -> _T:
            return read(await self.execute(*first, parsed=False))

        done = await asyncio.gather(
            first_read(), *(self.execute(*c) for c in commands), return_exceptions=True
        )
        return done[0], list(done[1:])

    async def execute_all(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Each command's reply, in order, sent together (one pipeline, or in the next one);
        the first error raises."""
        line = self._line
        if (line is not None and not line.lost) or (line := await self._open_line()) is not None:
            try:
                replies = await asyncio.gather(
                    *(line.send(c) for c in commands), return_exceptions=True
                )
            except LineLost:  # lost before all were sent
                replies = [LineLost()]
            if any(isinstance(reply, LineLost) for reply in replies):
                return await self._pipelined(commands, raise_on_error=True)
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
            return replies
        if self._slot_free():
            try:
                return await self._pipelined(commands, raise_on_error=True)
            finally:
                self._returned()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = []
        for command in commands:
            futures.append(loop.create_future())
            self._waiting.append((command, futures[-1]))
        return [await future for future in futures]

    async def aclose(self) -> None:
        """Give the shared connection back to the pool; later calls go through redis-py."""
        self._multiplexed = False
        if self._opening is not None:
            with contextlib.suppress(Exception):
                await self._opening
        if self._line is not None:
            line, self._line = self._line, None
            await line.close()

    async def _open_line(self) -> MultiplexedConnection | None:
        """The shared connection, opened now if it may be (one opening for every caller)."""
        if not self._multiplexed or asyncio.get_running_loop().time() < self._reopen_at:
            return None
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_task(self._reopen())
        return await asyncio.shield(self._opening)  # a caller cancelled leaves it opening

    async def _reopen(self) -> MultiplexedConnection | None:
        try:
            if self._line is not None:  # lost: back to the pool, which reconnects it when used
                line, self._line = self._line, None
                await line.close()
            self._line = await MultiplexedConnection.open(self._client)
        except (RedisError, OSError):  # Redis is down: redis-py's own path, retried in a second
            self._reopen_at = asyncio.get_running_loop().time() + _REOPEN_AFTER
        finally:
            self._opening = None
        return self._line

    def _slot_free(self) -> bool:
        """Whether a call may go now, alone (then it holds a slot until it returns)."""
        if self._in_flight < self._slots and not self._waiting:
            self._in_flight += 1
            return True
        return False

    async def _pipelined(
        self, commands: Sequence[tuple[Any, ...]], raise_on_error: bool
    ) -> list[Any]:
        pipeline: Any = self._client.pipeline(transaction=False)
        async with pipeline as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=raise_on_error))

    def _returned(self) -> None:
        self._in_flight -= 1
        while self._waiting and self._in_flight < self._slots:
            batch = [call for call in self._waiting[: self._most] if not call[1].done()]
            del self._waiting[: self._most]
            if batch:
                self._in_flight += 1
                send = asyncio.get_running_loop().create_task(self._send(batch))
                self._sends.add(send)  # a task nothing holds may be collected mid-send
                send.add_done_callback(self._sends.discard)

    async def _send(self, batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        try:
            replies = await self._pipelined([command for command, _ in batch], False)
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # the connection failed: every call of the send did
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        else:
            for (_, future), reply in zip(batch, replies, strict=True):
                if future.done():
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
        finally:
            self._returned()


def own_client(url: str) -> Redis:
    """The client the SDK makes for itself from ``redis_url``. redis-py's own pool: its commands
    of many tasks go in few connections (:class:`CommandBatches`), and a blocking pool costs
    every command about 13 µs here (its condition and timeout)."""
    return Redis.from_url(url, health_check_interval=10)


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def after_own_echoes() -> None:
    """A subscription's read brought only this instance's own echoes. Nothing to do here: the
    push listener drops them as they arrive, without waking the subscriber's task (the sync
    twin rests its thread)."""


async def all_of(calls: Sequence[Callable[[], Awaitable[Any]]]) -> None:
    """Each of ``calls``, all at once (their commands go out together); the first failure
    raises once every call is done."""
    results = await asyncio.gather(*(call() for call in calls), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def alongside(main: Callable[[], Awaitable[_T]], side: Callable[[], Awaitable[None]]) -> _T:
    """``main()``'s result, with ``side()`` run meanwhile in a task of its own; both are done
    when this returns. A failure of ``side`` raises once ``main`` is done; a failure of
    ``main`` (or a cancellation) cancels ``side``."""
    task = asyncio.ensure_future(side())
    try:
        result = await main()
    except BaseException:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise
    await task
    return result


def close_at_exit(client: Any) -> Callable[[], None] | None:
    """Nothing: no event loop runs once the interpreter exits, so an async instance is closed by
    ``async with`` or the application's shutdown hook (FastAPI's lifespan). Its queued events
    are delivered by the next instance otherwise."""
    return None


def forget_at_exit(hook: Callable[[], None] | None) -> None:
    return None


def start_afresh_after_fork(client: Any) -> None:
    """Nothing: an event loop does not survive a fork either; a forked worker builds its own
    instance in its own loop (uvicorn and gunicorn's async workers do)."""
    return None


async def run_blocking(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` on a thread of the loop's pool: work that would stall every task."""
    return await asyncio.to_thread(function, *args)


def open_pubsub(client: Redis) -> Any:
    return client.pubsub()


async def close_pubsub(pubsub: Any) -> None:
    await pubsub.aclose()


def interrupt_pubsub(pubsub: Any) -> None:
    """Nothing to do here: closing cancels the task that reads the subscription (the sync
    twin wakes its thread, which would otherwise block until its poll ends)."""


async def read_pubsub(
    pubsub: Any, timeout: float, drop: Callable[[Any], bool] | None = None
) -> list[Any]:
    """The raw replies that came on a subscription (``[b"smessage", channel, data]``, not
    redis-py's messages), waiting up to ``timeout`` seconds for the first, without those
    ``drop`` accepts (this instance's echoes). Once subscribed, with hiredis, the connection
    is read straight from its transport (:class:`PushListener`); otherwise the first reply
    comes through redis-py and the rest straight from the connection's hiredis reader."""
    listener = _listeners.get(pubsub)
    if listener is None or not listener.reads(pubsub.connection):
        listener = None
        if pubsub.connection is not None and pubsub.subscribed:
            listener = PushListener.take_over(pubsub, drop)
            if listener is not None:
                _listeners[pubsub] = listener
    if listener is not None:
        return await listener.read(timeout)
    response = await pubsub.parse_response(block=False, timeout=timeout)
    if response is None:
        return []
    return [response, *buffered_replies(pubsub)]


_listeners: weakref.WeakKeyDictionary[Any, PushListener] = weakref.WeakKeyDictionary()


async def run_on_node(
    cluster: RedisCluster, node: ClusterNode, commands: list[tuple[Any, ...]]
) -> list[Any]:
    """Send ``commands`` to one node of a cluster on one of its connections, in one round trip,
    without following redirections: each reply, or the error it was. A lone command (a
    track's script) goes without a pipeline: building one cost it more than its parsing."""
    if len(commands) == 1:
        try:
            return [await node.execute_command(*commands[0])]
        except ResponseError as exc:  # MOVED, ASK, NOSCRIPT...: the caller decides
            return [exc]
    pipeline = [PipelineCommand(n, *args) for n, args in enumerate(commands)]
    await node.execute_pipeline(pipeline)
    return [command.result for command in pipeline]


async def release_node_connections(cluster: RedisCluster) -> None:
    """Nothing to give back: each command on a node takes a connection and returns it (the
    sync twin keeps some for scripts)."""


def open_node_pubsub(cluster: RedisCluster, node: ClusterNode) -> Any:
    """A pub/sub connection of its own to one node of a cluster, with the cluster's settings."""
    pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
    return Redis(connection_pool=pool).pubsub()


async def close_node_pubsub(pubsub: Any) -> None:
    await pubsub.aclose()
    await pubsub.connection_pool.disconnect()


def node_connections(node: ClusterNode) -> Any:
    """What holds a cluster node's connections: the node itself (the sync twin's node hands its
    client on to the next node object of the same address)."""
    return node


async def close_cluster_node(node: ClusterNode) -> None:
    """Close the connections a cluster client's node holds (it left the slot map)."""
    await node.disconnect()


async def call_back(function: Callable[..., Any], *args: Any) -> None:
    """Call a user callback, awaiting it if it is a coroutine function."""
    result = function(*args)
    if asyncio.iscoroutine(result):
        await result


class Stream:
    """A TCP (or TLS) connection to Polar's WebSocket endpoint."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def send(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def receive(self, timeout: float) -> bytes | None:
        """Bytes, ``b""`` at EOF, or ``None`` when nothing came within ``timeout``."""
        try:
            return await asyncio.wait_for(self._reader.read(65536), max(timeout, 0))
        except TimeoutError:
            return None

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await self._writer.wait_closed()


async def open_stream(
    host: str, port: int, context: ssl.SSLContext | None, timeout: float
) -> Stream:
    """Connect, through the proxy httpx would use (see ``outpost_io.proxy``), and shake hands
    over TLS with ``context`` when it is given (``wss://``)."""
    reader, writer = await asyncio.wait_for(_connect(host, port, context), timeout)
    return Stream(reader, writer)


async def _connect(
    host: str, port: int, context: ssl.SSLContext | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    proxy = proxy_for(host, context is not None)
    if proxy is None:
        return await asyncio.open_connection(host, port, ssl=context)
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    try:
        writer.write(proxy.connect_request(host, port))
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise ProxyError(f"the proxy {proxy.url} closed or overran its reply: {exc}") from exc
        proxy.check_reply(head, host, port)
        if context is not None:
            await writer.start_tls(context, server_hostname=host)
    except BaseException:
        writer.close()
        raise
    return reader, writer
