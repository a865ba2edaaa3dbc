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
from redis.exceptions import ResponseError

from outpost_io.proxy import MAX_REPLY, ProxyError, proxy_for
from outpost_io.pubsub import buffered_replies
from outpost_sync._batches import CommandBatches

_T = TypeVar("_T")


def CoreLock() -> contextlib.AbstractContextManager[Any]:  # the async twin: no lock
    """Application threads and the subscriber thread share the core: one re-entrant lock
    (threading's own, whose ``with`` runs in C: it is taken several times per call)."""
    return threading.RLock()


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
