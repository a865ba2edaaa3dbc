# GENERATED from outpost_async/_context.py by scripts/unasync.py: do not edit.
"""What the parts of one driver instance share: one :class:`DriverContext`.

The public client (``_client.py``) builds it (:func:`open_context`); the loops
(``_subscriber.py``, ``_cluster.py``, ``_delivery.py``, ``_websocket.py``, ``_telemetry.py``), the
effect runner (``_effects.py``) and the reads and writes (``_reads.py``, ``_tracking.py``) each
take it, instead of reaching into one class's attributes. It holds the sans-IO session and the lock
around it, the Redis clients, the connection options, the outage trackers and the little state the
loops hand each other (the WebSocket stream, a connection asked for).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Protocol

import attrs
import httpx
from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisError

from outpost_core import (
    ConfigurationError,
    ConnectionOptions,
    DeliveryRecovery,
    Link,
    OpenConnection,
    Outage,
    RedisUnavailable,
    Report,
    Session,
    Settings,
    Target,
    cluster_node_url,
    keys,
    to_us,
)
from outpost_io.telemetry import Telemetry
from outpost_io.traces import Traces
from outpost_sync._backend import CallLimit, CoreLock, Signal, Stream, own_client
from outpost_sync._batches import CommandBatches
from outpost_sync._departed import DepartedNodes

POLL = 0.25  # seconds a loop blocks on Redis or the socket before it looks at deadlines again
_NODE_CALLS = 64  # calls at once to cluster nodes (redis-py's node pools refuse a 101st)
DroppedCallback = Callable[[list[dict[str, Any]], str], Any]


class Clock(Protocol):
    def now(self) -> datetime: ...


@attrs.define(eq=False)
class DriverContext:
    """One instance's shared parts. Every call into ``session`` is made holding ``lock`` (the
    sync driver's threads share the session, which is not thread-safe), but for
    ``session.own_echo``, the subscriber's one question, safe without it."""

    session: Session
    lock: Any
    signal: Signal
    """Fired whenever the session's state changed: waiting readers and loops look again."""
    deliveries: Signal
    """Wakes the delivery loops from their waits (a sleep, an idle round, a re-read held off):
    a flush begins, the instance closes, a loop settled, a channel moved. Not at every change:
    a loop woken per track() cost the sync driver a thread switch each."""
    redis: Redis
    cluster: RedisCluster | None
    """The same client as ``redis`` when it is a cluster: a few calls differ on one."""
    batches: CommandBatches
    """Scripts and hash reads of many tasks at once, sent together (the sync twin: one by one)."""
    node_calls: Any
    """Calls at once to cluster nodes: redis-py's node pools refuse them past 100."""
    shards: int
    """The deployment's shard count, as configured: checked against Redis's at start."""
    channels: tuple[str, ...]
    outboxes: tuple[str, ...]
    """Every shard's outbox stream, in shard order."""
    consumer: str
    """This instance's name in the outbox streams' consumer group."""
    log: logging.Logger
    telemetry: Telemetry
    traces: Traces
    tls: ssl.SSLContext
    clock: Clock | None
    access_token: str | None
    server_url: str
    on_dropped: DroppedCallback | None
    # Each loop that talks to Redis reports an outage once, then once a minute, then its end.
    state_outage: Outage = attrs.field(factory=lambda: Outage("loading state"))
    subscriber_outage: Outage = attrs.field(factory=lambda: Outage("the change subscription"))
    recovery: DeliveryRecovery = attrs.field(factory=DeliveryRecovery)
    """What the delivery loops do after a Redis failure, and when one re-reads this consumer's
    pending entries: every loop's Redis failure goes to it (another loop's through
    :meth:`redis_failed`). On a cluster a shard that moved to another node counts too: a primary
    replaced while alive (it stalled, or an operator's ``CLUSTER FAILOVER``) fails no call, since
    redis-py follows the ``MOVED`` it answers, yet a settlement it never replicated is lost as in
    a crash."""
    closed: bool = False
    http: httpx.Client | None = None
    """Polar's ingestion API, once started with a token."""
    stream: Stream | None = None
    """The WebSocket's connection while the link loop holds one open."""
    want_open: OpenConnection | None = None
    """A connection the session asked for, for the link loop to open."""
    drop_stream: bool = False
    """The session asked to close the connection: the link loop closes it."""
    flushing: int = 0
    """flush() calls waiting: delivery sends what it holds at once."""
    settling: int = 0
    """Settle scripts running: a flush waits for their replies too."""
    empty_rounds: int = 0
    """On a cluster: rounds of outbox reads in a row that found nothing (each idle round waits
    longer before the next, up to the read's block)."""
    departed_nodes: DepartedNodes = attrs.field(factory=DepartedNodes)
    """On a cluster: the nodes that left the slot map, whose connections the driver closes."""

    def now_us(self) -> int:
        if self.clock is None:
            return time.time_ns() // 1000
        return to_us(self.clock.now())

    def redis_failed(self, outage: Outage, exc: BaseException) -> float:
        """A Redis failure of a loop other than delivery's (the delivery loops ask ``recovery``):
        log what its outage says, count it; return the delay."""
        with self.lock:
            delay, report = outage.failed(time.monotonic(), str(exc), random.random())
            self.recovery.failed_elsewhere()
        log_report(self.log, report)
        return delay

    def redis_answered(self, outage: Outage) -> None:
        if outage.down:
            with self.lock:
                report = outage.succeeded(time.monotonic())
            log_report(self.log, report)

    def until_deadline(self) -> float:
        """Seconds until the session's next deadline, at most :data:`POLL`."""
        with self.lock:  # the sync driver's other threads change the flows it looks at
            deadline = self.session.next_deadline()
        if deadline is None:
            return POLL
        return min(max(deadline - time.monotonic(), 0.0), POLL)


def open_context(
    options: ConnectionOptions,
    redis: Redis | RedisCluster | None,
    *,
    tls: ssl.SSLContext,
    ca_bundle: str | None,
    log: logging.Logger,
    snapshot_timeout: float,
    max_customers: int,
    idle_customer_ttl: float,
    telemetry_interval: float,
    telemetry_to_app: bool,
    clock: Clock | None,
    on_dropped: DroppedCallback | None,
    record_to: str | os.PathLike[str] | None,
    shards: int,
) -> DriverContext:
    """The shared parts of a new instance (nothing is connected yet)."""
    if redis is None:
        redis = redis_from_url(options.redis_url)
    # On a cluster the driver sends the same commands, one slot per command (one shard's keys,
    # or one outbox stream); only the subscriber, the outbox reads and script loading differ
    # (``_cluster.py``).
    cluster = redis if isinstance(redis, RedisCluster) else None
    # Pub/sub ignores numbered databases: name the channels after ours (a cluster has one).
    database = (
        0
        if isinstance(redis, RedisCluster)
        else redis.connection_pool.connection_kwargs.get("db", 0)
    )
    namespace = keys.namespace_of_database(int(database or 0))
    traces = Traces(record_to)
    link = None
    if options.access_token:
        link = Link(Target.of(options.server_url), options.access_token, traces.rng(0))
    settings = Settings(
        snapshot_timeout=snapshot_timeout,
        channel_namespace=namespace,
        max_customers=max_customers,
        idle_customer_ttl=idle_customer_ttl,
        shards=shards,
    )
    server_url = options.server_url if link else None
    session = traces.session(Session(settings, link), settings, server_url)
    telemetry = Telemetry(
        enabled=options.telemetry,
        relay_url=options.telemetry_url,
        token=options.access_token,
        export_interval=telemetry_interval,
        logger=log,
        ca_bundle=ca_bundle,
        to_app=telemetry_to_app,
    )
    if telemetry.enabled:
        session.count_warm_reads()
    return DriverContext(
        session=session,
        lock=CoreLock(),
        signal=Signal(),
        deliveries=Signal(),
        redis=redis,  # type: ignore[arg-type]
        cluster=cluster,
        # Scripts and hash reads of many tasks at once go in one pipeline (async; the sync twin
        # sends each as it comes).
        batches=CommandBatches(redis),  # type: ignore[arg-type]
        node_calls=CallLimit(_NODE_CALLS),
        shards=shards,
        channels=keys.all_channels(namespace, shards),
        outboxes=keys.all_outboxes(shards),
        consumer=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
        log=log,
        telemetry=telemetry,
        traces=traces,
        tls=tls,
        clock=clock,
        access_token=options.access_token,
        server_url=options.server_url,
        on_dropped=on_dropped,
    )


def redis_from_url(url: str) -> Redis | RedisCluster:
    """``redis+cluster://host:port`` (or ``rediss+cluster://``) names a cluster by any of its
    nodes; any other URL, one Redis."""
    try:
        node = cluster_node_url(url)
        if node is not None:
            return RedisCluster.from_url(node)
        client: Redis = own_client(url)
    except ValueError as exc:  # redis-py's word for a URL it cannot use (never the URL itself)
        raise ConfigurationError(f"redis_url: {exc}") from None
    return client


def log_report(log: logging.Logger, report: Report | None) -> None:
    if report is not None:
        log.log(report.level, report.message)


def failed_in_redis(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis (or the way to it) failing, not a bug of ours: a redis-py error,
    a socket error, our own :class:`RedisUnavailable` (what a caller's path made of one), or an
    ``AttributeError``/``TypeError`` raised inside redis-py itself (its cluster client, under a
    fail-over, closes connections other calls are using)."""
    if isinstance(exc, RedisError | OSError | RedisUnavailable):
        return True
    if not isinstance(exc, AttributeError | TypeError):
        return False
    innermost = exc.__traceback__
    while innermost is not None and innermost.tb_next is not None:
        innermost = innermost.tb_next
    module = innermost.tb_frame.f_globals.get("__name__", "") if innermost else ""
    return module == "redis" or module.startswith("redis.")


@contextlib.contextmanager
def redis_unavailable(what: str) -> Iterator[None]:
    """Around Redis calls made for a caller: whatever Redis's failure looks like in redis-py,
    the caller gets :class:`RedisUnavailable` (``what``: what was being done). Our own bugs
    pass through as they are."""
    try:
        yield
    except RedisUnavailable:
        raise
    except Exception as exc:
        if not failed_in_redis(exc):
            raise
        raise RedisUnavailable(f"Redis failed {what}: {exc}") from exc
