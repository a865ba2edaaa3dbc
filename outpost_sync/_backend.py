"""What threads do for the sync driver: workers, waiting for a change, sleeping.

The twin of ``outpost_async/_backend.py``, with the same names.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from redis import BlockingConnectionPool, ConnectionPool, Redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is an extra; without it redis-py does it all
    hiredis = None  # type: ignore[assignment,unused-ignore]

from outpost_io.proxy import MAX_REPLY, ProxyError, proxy_for
from outpost_io.pubsub import buffered_replies


def CoreLock() -> contextlib.AbstractContextManager[Any]:  # the async twin: no lock
    """Application threads and the subscriber thread share the core: one re-entrant lock
    (threading's own, whose ``with`` runs in C: it is taken several times per call)."""
    return threading.RLock()


class CommandBatches:
    """Each command sent as it comes: a thread waits for its own reply (the async twin pipelines
    the commands of many tasks).

    Scripts (``EVALSHA``, ``EVAL``: no reply callback in redis-py) and ``HGETALL`` go, with
    hiredis, on connections this object keeps from the client's pool: packed by hiredis,
    written and read on the connection, without redis-py's command layers (its encoding of each
    argument, the pool's lock, its retry and event hooks), which cost a ``track()`` about as
    much as the script's own work in Redis, and a ``balance(fresh=True)`` a third of its
    ``HGETALL``. A connection that fails is dropped and the command goes once more the usual
    way, through redis-py (whose retry it would have had; both are safe to send twice: a track
    sent twice is counted once, by its id)."""

    def __init__(
        self, client: Redis, slots: int = 4, most: int = 512, shared_connection: bool = True
    ) -> None:
        self._client = client
        pool = getattr(client, "connection_pool", None)
        self._pool: Any = pool if _packs(pool) else None
        self._idle: list[Any] = []  # connections kept for scripts: list.pop/append are atomic
        self._pid = os.getpid()

    def execute(self, *command: Any, parsed: bool = True) -> Any:
        """``command``'s reply; not ``parsed``: as Redis sent it, where redis-py allows (a
        stream read's reply callback costs more than the read, in the GIL the callers want)."""
        if self._pool is not None and command[0] in _STRAIGHT:
            return self._straight(command)
        if not parsed:  # redis-py looks its reply callbacks up by a command name in text
            command = (str(command[0]).encode(), *command[1:])
        return self._client.execute_command(*command)  # type: ignore[no-untyped-call]

    def _borrow(self) -> Any:
        """A connection kept for scripts, or ``None`` when the pool cannot give one now."""
        if self._pid != os.getpid():  # forked: the parent's connections are not this process's
            self._idle, self._pid = [], os.getpid()
        try:
            return self._idle.pop()
        except IndexError:
            try:
                return self._pool.get_connection()
            except (RedisConnectionError, RedisTimeoutError, OSError):
                return None

    def _straight(self, command: tuple[Any, ...]) -> Any:
        connection = self._borrow()
        if connection is None:
            return self._client.execute_command(*command)  # type: ignore[no-untyped-call]
        try:
            connection.send_packed_command([hiredis.pack_command(command)])
            reply = connection.read_response()
        except ResponseError:  # Redis answered (NOSCRIPT, a script's error): the line is fine
            self._keep(connection)
            raise
        except (RedisConnectionError, RedisTimeoutError, OSError):
            # Lost on the way (a restarted Redis, a stale line): once more through redis-py, as
            # its retry would have sent it again.
            self._drop(connection)
            return self._client.execute_command(*command)  # type: ignore[no-untyped-call]
        except BaseException:
            self._drop(connection)
            raise
        self._keep(connection)
        shape = _STRAIGHT[command[0]]
        return reply if shape is None else shape(reply)

    def _drop(self, connection: Any) -> None:
        connection.disconnect()
        self._pool.release(connection)

    def _keep(self, connection: Any) -> None:
        if len(self._idle) < _KEPT:
            self._idle.append(connection)
        else:
            self._pool.release(connection)

    def scripts(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Each script's reply, or the error it met (never raised), all sent in one round trip:
        on a connection kept for scripts, else in one of redis-py's pipelines."""
        connection = self._borrow() if self._pool is not None else None
        if connection is None:
            try:
                return self._pipelined(commands, raise_on_error=False)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                return [exc] * len(commands)
        replies: list[Any] = []
        try:
            connection.send_packed_command([hiredis.pack_command(c) for c in commands])
            for _ in commands:
                try:
                    replies.append(connection.read_response())
                except ResponseError as exc:  # this script's: the line is fine
                    replies.append(exc)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            self._drop(connection)
            return replies + [exc] * (len(commands) - len(replies))
        except BaseException:
            self._drop(connection)
            raise
        self._keep(connection)
        return replies

    def first_then_scripts(
        self,
        first: tuple[Any, ...],
        read: Callable[[Any], _T],
        commands: Sequence[tuple[Any, ...]],
    ) -> tuple[_T | BaseException, list[Any]]:
        """``first`` (its reply as Redis sent it, made into ``read(reply)``) and the scripts
        ``commands`` behind it, in one round trip: Redis runs the scripts while ``read`` works on
        the first reply. Each result, or the error it met (never raised)."""
        unparsed = (str(first[0]).encode(), *first[1:])  # no reply callback in redis-py
        connection = self._borrow() if self._pool is not None else None
        if connection is None:
            try:
                replies = self._pipelined([unparsed, *commands], raise_on_error=False)
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                return exc, [exc] * len(commands)
            return _read_or_error(read, replies[0]), replies[1:]
        results: list[Any] = []  # the first's, then each script's
        try:
            connection.send_packed_command([hiredis.pack_command(c) for c in (first, *commands)])
            for n in range(len(commands) + 1):
                try:
                    reply = connection.read_response()
                except ResponseError as exc:  # this command's: the line is fine
                    reply = exc
                results.append(reply if n else _read_or_error(read, reply))
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            self._drop(connection)
            results += [exc] * (len(commands) + 1 - len(results))
        except BaseException:
            self._drop(connection)
            raise
        else:
            self._keep(connection)
        return results[0], results[1:]

    def execute_all(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Each command's reply, in order, in one pipeline; the first error raises."""
        return self._pipelined(commands, raise_on_error=True)

    def _pipelined(self, commands: Sequence[tuple[Any, ...]], *, raise_on_error: bool) -> list[Any]:
        with self._client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)  # type: ignore[no-untyped-call]
            return list(pipe.execute(raise_on_error=raise_on_error))

    def close(self) -> None:
        """Give the connections kept back to the pool."""
        idle, self._idle = self._idle, []
        if self._pool is not None and self._pid == os.getpid():
            for connection in idle:
                self._pool.release(connection)


def _hash(reply: Any) -> Any:
    """An ``HGETALL`` reply as redis-py's callback makes it: a mapping (RESP3 sends one; RESP2
    a flat list of names and values)."""
    return dict(zip(reply[::2], reply[1::2], strict=True)) if isinstance(reply, list) else reply


# The commands sent straight on a kept connection, and what makes each reply redis-py's.
_STRAIGHT: dict[str, Callable[[Any], Any] | None] = {
    "EVALSHA": None,
    "EVAL": None,
    "HGETALL": _hash,
}
_KEPT = 16  # connections kept for scripts at most: more threads at once borrow from the pool


def _packs(pool: Any) -> bool:
    """Whether scripts can go straight on this pool's connections: hiredis is there to pack
    them."""
    return hiredis is not None and pool is not None and hasattr(pool, "get_connection")


def CallLimit(calls: int) -> threading.BoundedSemaphore:  # the async twin: asyncio's
    """At most ``calls`` threads inside at once (``with``); the others wait their turn."""
    return threading.BoundedSemaphore(calls)


class Signal:
    """Wakes every waiter when the core's state changed. Waiters pass the version they saw, so a
    change between their check and their wait is never missed."""

    def __init__(self) -> None:
        self._version = 0
        self._condition = threading.Condition()

    @property
    def version(self) -> int:
        return self._version

    def fire(self) -> None:
        with self._condition:
            self._version += 1
            self._condition.notify_all()

    def wait(self, version: int, timeout: float) -> None:
        if timeout <= 0:
            return
        with self._condition:
            self._condition.wait_for(lambda: self._version != version, timeout)


class Worker:
    """One background thread. Its target polls the client's ``closed`` flag and returns once it
    is set; ``stop`` waits for that."""

    def __init__(self, name: str, target: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds, but at least one poll of the ``closed`` flag (0.25 s)
        and a little: a thread still inside a request to a Polar that does not answer is left to
        end on its own (it is a daemon)."""
        self._thread.join(timeout=max(timeout, 0.3))


_T = TypeVar("_T")


def _read_or_error(read: Callable[[Any], _T], reply: Any) -> _T | BaseException:
    return reply if isinstance(reply, BaseException) else read(reply)


_CONNECTIONS = 100  # at most this many connections, as redis-py 8's pool
_CONNECTION_WAIT = 20.0  # seconds a call waits for one of them before it fails


def own_client(url: str) -> Redis:
    """The client the SDK makes for itself from ``redis_url``: a call that finds every connection
    busy waits for one, rather than fail. redis-py 8's pool refuses a 101st (300 threads tracking
    at once failed that way); the blocking pool costs a command 1-3 µs more here."""
    pool = BlockingConnectionPool.from_url(
        url, health_check_interval=10, max_connections=_CONNECTIONS, timeout=_CONNECTION_WAIT
    )
    return Redis.from_pool(pool)


def sleep(seconds: float) -> None:
    time.sleep(seconds)


ECHO_REST = 0.0003
"""Seconds the subscriber thread rests after a read that brought only this instance's own
echoes (the async twin's listener drops them without waking its task)."""


def after_own_echoes() -> None:
    """A subscription's read brought only this instance's own echoes: rest the thread a moment,
    so that a busy caller's next echoes come in one read rather than each waking this thread,
    which then holds the GIL the caller waits for. ``bench.decompose`` measured a sync
    ``track()`` at 1.21-1.28 times its bare script with the rest and 1.36-1.37 without; a change
    of another instance arriving meanwhile waits for the rest to end (a few tenths of a
    millisecond, only behind this instance's own echoes)."""
    time.sleep(ECHO_REST)


def all_of(calls: Sequence[Callable[[], Any]]) -> None:
    """Each of ``calls``, one after the other (the async twin runs them at once)."""
    for call in calls:
        call()


def alongside(main: Callable[[], _T], side: Callable[[], None]) -> _T:
    """``main()``'s result, with ``side()`` run meanwhile on a thread of its own; both are done
    when this returns. A failure of ``side`` raises once ``main`` is done (the async twin also
    cancels ``side`` when ``main`` fails: a thread is waited for instead)."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            side()
        except BaseException as exc:  # raised again in the caller's thread
            failures.append(exc)

    thread = threading.Thread(target=run, name="outpost-alongside", daemon=True)
    thread.start()
    try:
        result = main()
    finally:
        thread.join()
    if failures:
        raise failures[0]
    return result


EXIT_TIMEOUT = 5.0
"""How long an instance left open flushes when the interpreter exits."""


def close_at_exit(client: Any) -> Callable[[], None] | None:
    """Close ``client`` when the interpreter exits normally (a script's end, a worker's graceful
    shutdown), so what it queued is delivered now rather than by the next instance. The hook
    holds the client weakly; :func:`forget_at_exit` removes it once the client is closed."""
    ref = weakref.ref(client)

    def hook() -> None:
        instance = ref()
        if instance is not None:
            instance.close(EXIT_TIMEOUT)

    atexit.register(hook)
    return hook


def forget_at_exit(hook: Callable[[], None] | None) -> None:
    if hook is not None:
        atexit.unregister(hook)


def start_afresh_after_fork(client: Any) -> None:
    """Have a forked child rebuild ``client`` (its ``_after_fork``): threads do not survive a
    fork, so a child left with the parent's started instance would neither follow changes nor
    deliver. Held weakly; a hook cannot be removed, and one for a closed client does nothing."""
    ref = weakref.ref(client)

    def hook() -> None:
        instance = ref()
        if instance is not None:
            instance._after_fork()

    os.register_at_fork(after_in_child=hook)


def run_blocking(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, here: the calling worker is a thread of its own (the async twin hands
    it to a thread)."""
    return function(*args)


def open_pubsub(client: Redis) -> Any:
    return client.pubsub()  # type: ignore[no-untyped-call,unused-ignore]


def close_pubsub(pubsub: Any) -> None:
    pubsub.close()
    # A cluster's pub/sub holds one connection per node, which its close() leaves open.
    for node_pubsub in list(getattr(pubsub, "node_pubsub_mapping", {}).values()):
        node_pubsub.close()


def interrupt_pubsub(pubsub: Any) -> None:
    """Wake the thread reading ``pubsub`` (the instance is closing): its socket is shut down,
    so the read in progress ends at once with an error rather than at the end of its poll
    (a quarter of a second that every close() waited for)."""
    connection = getattr(pubsub, "connection", None)
    sock = getattr(connection, "_sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def read_pubsub(
    pubsub: Any, timeout: float, drop: Callable[[Any], bool] | None = None
) -> list[Any]:
    """The raw replies that came on a subscription (``[b"smessage", channel, data]``, not
    redis-py's messages), waiting up to ``timeout`` seconds for the first.

    With hiredis it reads the socket into the connection's own reader and takes every reply it
    holds: a few microseconds a message, against some tens through redis-py's layers. That
    matters here more than in the async twin: the echo of every ``track()`` wakes the
    subscriber thread, and what it does then, it does holding the GIL the caller waits for.
    ``drop`` is for the async twin, which drops echoes as they arrive; the thread reading here
    checks each reply itself.
    """
    if not pubsub.subscribed and not pubsub.subscribed_event.wait(timeout):
        return []  # nothing to read before a first subscription (a cluster node's, say)
    parser: Any = getattr(pubsub.connection, "_parser", None)
    if not hasattr(parser, "read_from_socket") or not hasattr(
        getattr(parser, "_reader", None), "gets"
    ):  # the pure-Python parser: redis-py's own way, one reply at a time
        response = pubsub.parse_response(block=False, timeout=timeout)
        return [] if response is None else [response]
    replies = buffered_replies(pubsub)
    if replies:
        return replies
    connection = pubsub.connection
    pubsub.check_health()  # as redis-py's read does: a PING when the connection was idle
    if not parser.read_from_socket(timeout=timeout, raise_on_timeout=False):
        return []
    if connection.health_check_interval:  # as redis-py's read does: it heard from Redis
        connection.next_health_check = time.monotonic() + connection.health_check_interval
    return buffered_replies(pubsub)


def run_on_node(
    cluster: RedisCluster, node: ClusterNode, commands: list[tuple[Any, ...]]
) -> list[Any]:
    """Send ``commands`` to one node of a cluster on one of its connections, in one round trip,
    without following redirections: each reply, or the error it was. A lone command (a
    track's script) goes without a pipeline: building and resetting one cost it more than
    its parsing."""
    client: Any = cluster.get_redis_connection(node)
    if len(commands) == 1:
        batches = _node_batches.get(client)
        if batches is None:
            batches = _node_batches[client] = CommandBatches(client)
        try:
            return [batches.execute(*commands[0])]  # a script: on a connection kept for them
        except ResponseError as exc:  # MOVED, ASK, NOSCRIPT...: the caller decides
            return [exc]
    pipe: Any = client.pipeline(transaction=False)
    for args in commands:
        pipe.execute_command(*args)
    return list(pipe.execute(raise_on_error=False))


_node_batches: weakref.WeakKeyDictionary[Any, CommandBatches] = weakref.WeakKeyDictionary()
"""Each cluster node's client's command batches (the connections kept for scripts)."""


def release_node_connections(cluster: RedisCluster) -> None:
    """Give the connections kept for scripts back to each node's pool: a cluster client the
    application passed in outlives the instance (another instance on the same client takes
    new ones as it needs them)."""
    for node in cluster.get_nodes():  # type: ignore[no-untyped-call,unused-ignore]
        batches = _node_batches.pop(node.redis_connection, None)
        if batches is not None:
            batches.close()


def open_node_pubsub(cluster: RedisCluster, node: ClusterNode) -> Any:
    """A pub/sub connection of its own to one node of a cluster, with the cluster's settings (not
    from the node's pool: the cluster client disconnects that pool when its slot map changes)."""
    pool = cluster.get_redis_connection(node).connection_pool
    own = ConnectionPool(connection_class=pool.connection_class, **pool.connection_kwargs)
    return Redis(connection_pool=own).pubsub()  # type: ignore[no-untyped-call,unused-ignore]


def close_node_pubsub(pubsub: Any) -> None:
    pubsub.close()
    pubsub.connection_pool.disconnect()


def node_connections(node: ClusterNode) -> Any:
    """What holds a cluster node's connections: its client, which redis-py hands on to the new
    node object of the same address when it reads the slot map again."""
    return node.redis_connection


def close_cluster_node(node: ClusterNode) -> None:
    """Close the connections a cluster client's node holds (it left the slot map)."""
    if node.redis_connection is not None:
        node.redis_connection.connection_pool.disconnect()


def call_back(function: Callable[..., Any], *args: Any) -> None:
    """Call a user callback."""
    function(*args)


class Stream:
    """A TCP (or TLS) connection to Polar's WebSocket endpoint. One thread receives; any thread
    may send (sends are serialised)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()

    def send(self, data: bytes) -> None:
        with self._send_lock:
            self._sock.sendall(data)

    def receive(self, timeout: float) -> bytes | None:
        """Bytes, ``b""`` at EOF, or ``None`` when nothing came within ``timeout``."""
        pending = isinstance(self._sock, ssl.SSLSocket) and self._sock.pending()
        if not pending:
            readable, _, _ = select.select([self._sock], [], [], max(timeout, 0))
            if not readable:
                return None
        return self._sock.recv(65536)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def open_stream(host: str, port: int, context: ssl.SSLContext | None, timeout: float) -> Stream:
    """Connect, through the proxy httpx would use (see ``outpost_io.proxy``), and shake hands
    over TLS with ``context`` when it is given (``wss://``)."""
    proxy = proxy_for(host, context is not None)
    address = (host, port) if proxy is None else (proxy.host, proxy.port)
    sock = socket.create_connection(address, timeout=timeout)
    try:
        if proxy is not None:
            sock.sendall(proxy.connect_request(host, port))
            proxy.check_reply(_reply_head(sock, proxy.url), host, port)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return Stream(sock)


def _reply_head(sock: socket.socket, url: str) -> bytes:
    """The proxy's reply up to its blank line. Nothing follows it until the client speaks, so
    reading in chunks takes no byte of the tunnel."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk or len(head) > MAX_REPLY:
            raise ProxyError(f"the proxy {url} closed or overran its reply")
        head += chunk
    return head
