"""What asyncio does for the async driver: tasks, waiting for a change, sleeping.

``outpost_sync/_backend.py`` offers the same names with threads. The driver's other modules are
written once (here, async) and the sync ones are generated from them; these two files, the two
``_batches.py`` (how each driver sends its commands) and the async driver's shared connection
(``_multiplexed.py``, ``_listener.py``) are the hand-written difference between the drivers.
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
from redis.exceptions import ResponseError

from outpost_async._listener import PushListener
from outpost_io.proxy import ProxyError, proxy_for
from outpost_io.pubsub import buffered_replies

_T = TypeVar("_T")


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
