"""The Outpost client, written once: this async file is the source, and the threaded twin is
generated from it by ``scripts/unasync.py`` (edit the async one, then regenerate).

The client is a thin driver: it moves replies and messages between Redis and the sans-IO
``outpost_core.Session`` and runs the effects the session asks for. Anything that decides what an
input means lives in the core.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol, TypeVar

import attrs
import httpx
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    MovedError,
    NoScriptError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from outpost_async._backend import (
    CallLimit,
    CommandBatches,
    CoreLock,
    Signal,
    Stream,
    Worker,
    call_back,
    close_at_exit,
    close_node_pubsub,
    close_pubsub,
    forget_at_exit,
    open_node_pubsub,
    open_pubsub,
    open_stream,
    own_client,
    read_pubsub,
    run_blocking,
    run_on_node,
    sleep,
    start_afresh_after_fork,
)
from outpost_async._shared.ids import new_event_id
from outpost_async._shared.telemetry import LAST_EXPORT, Telemetry
from outpost_async._shared.tls import Verify, ca_bundle, cannot_connect, describe, tls_context
from outpost_async._shared.traces import Traces
from outpost_core import (
    CONFIGURATION_KEY,
    GROUP,
    SCRIPT_SHA1,
    SCRIPT_TEXT,
    Balance,
    BatchAnswered,
    BatchFailed,
    Beat,
    BudgetAnswered,
    BytesReceived,
    ChangePublished,
    ChannelsLost,
    ChannelSubscribed,
    CheckHeartbeats,
    ClaimStale,
    CloseConnection,
    Closing,
    ConfigurationReceived,
    ConnectionFailed,
    ConnectionOpened,
    ConnectionOptions,
    ConsumersListed,
    Delivery,
    DeliveryEffect,
    DeliveryInput,
    DeliverySettings,
    Done,
    Durability,
    Echoes,
    Effect,
    Fetch,
    ForgetHeartbeat,
    HeartbeatsChecked,
    IdentityLoaded,
    Link,
    ListFailed,
    ListPending,
    LoadFailed,
    LoadIdentity,
    NotDurable,
    NotReady,
    OpenConnection,
    Outage,
    OutboxRead,
    OutpostClosed,
    PendingListed,
    PostBatch,
    ReadOutbox,
    Reclaim,
    Reclaimed,
    RedisUnavailable,
    RefreshClaim,
    Report,
    ReportDropped,
    Reported,
    RunScript,
    ScriptFailed,
    ScriptReplied,
    SendBytes,
    Session,
    Settings,
    Settled,
    SettleScript,
    Sleep,
    Status,
    StoreConfiguration,
    StreamEntry,
    SubscriberLost,
    SubscriptionConfirmed,
    SurveyConsumers,
    TakeRequest,
    Target,
    Tick,
    UsageError,
    __version__,
    claimed_entries,
    cluster_node_url,
    event_id_of,
    hand_back,
    keys,
    lost_its_data,
    nothing_done,
    published_data,
    read_outcome,
    retry_after,
    semconv,
    stream_entries,
    text_of,
    timestamp_us_of,
    to_us,
    track_outcome,
    with_known_revs,
)

_POLL = 0.25  # seconds the subscriber blocks on Redis before it looks at deadlines again
_CLUSTER_POLL = 0.01  # seconds: a cluster subscriber looks again this soon after a break
_NODE_POLL = 0.05  # seconds a node's worker waits for a message before it looks at its tasks
_TOPOLOGY_CHECK = 1.0  # seconds between two looks at a cluster's slot map
_REDIRECTIONS = 5  # tries of a script on a cluster whose slot map is changing
_T = TypeVar("_T")
_CLOSE_RESERVE = 1.0  # seconds of close()'s timeout kept for what comes after its flush
_NODE_CALLS = 64  # calls at once to cluster nodes (redis-py's node pools refuse a 101st)
_TELEMETRY_TICK = 0.25  # seconds between two looks of the telemetry worker (it flushes each 1 s)
_RECHECK = 0.1  # seconds a waiting read (or track) sleeps at most between two looks
_USER_AGENT = f"outpost-python/{__version__}"
DroppedCallback = Callable[[list[dict[str, Any]], str], Any]


class Clock(Protocol):
    def now(self) -> datetime: ...


class AsyncOutpost:
    """A local, exact copy of Polar usage in a Redis you own.

    Args:
        access_token: Polar organization access token (default: env ``POLAR_ACCESS_TOKEN``).
        redis_url: Redis to keep the state in (default: env ``REDIS_URL``, else local Redis).
        redis: an existing client to use instead of ``redis_url``; it is not closed by ``close()``.
        server_url: Polar's API (default: env ``POLAR_SERVER_URL``, else ``https://api.polar.sh``).
        verify: which certificates Polar's TLS connections (the WebSocket and ingestion) trust,
            as httpx's ``verify``: ``True`` (httpx's default: ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``
            when set, else certifi's bundle), a CA bundle's path, or an ``ssl.SSLContext``.
        snapshot_timeout: seconds a first read waits for Polar's snapshot before ``NotReady``.
        max_attempts: deliveries of a batch before its events are dropped.
        on_dropped: called with the events Polar will never count, and why.
        telemetry: ``False`` (or env ``POLAR_OUTPOST_TELEMETRY=0``) records and sends nothing.
        clock: where event timestamps come from (an object with ``now() -> datetime``).
        max_in_flight: ingestion requests this instance may have open at once.
        batch_size, linger: a batch goes when it holds ``batch_size`` events or its first event
            has waited ``linger`` seconds.
        requests_per_minute: ingestion requests every instance sharing the Redis may send a
            minute together (Polar admits 500 per organization, 100 in the sandbox; the rest
            is left to the merchant's other API calls). A loop without one waits, and its batch
            keeps filling. ``0`` turns the shared budget off.
        batch_bytes: most bytes of one request body (Polar refuses more than 10 MiB); an event
            larger than that alone is dropped and reported to ``on_dropped``.
        heartbeat: seconds an instance stays alive for the others without a sign of life from
            its delivery loop (refreshed four times as often). Events held by an instance
            silent for that long (killed, or closed) are taken over by another at once.
        claim_idle: seconds after which the unsettled events of an instance that is alive but
            does not move them are taken over.
        retry_base: seconds before the first retry of a failed delivery; each retry doubles it
            (up to a minute), with jitter.
        telemetry_url, telemetry_interval: where the relay is (default: ``server_url``) and how
            often telemetry is exported to it (seconds).
        durability: ``"primary"`` (default): ``track()`` returns once the primary wrote the
            event. ``"replica"``: it also waits until a replica has it (``WAIT 1``), so a
            fail-over keeps it; when none acknowledges within ``durability_timeout`` seconds it
            raises :class:`NotDurable` (the event is written; a retry with its id is safe).
        record_to: a directory to write conformance traces to (``session.jsonl`` and one
            ``delivery-<n>.jsonl`` per delivery loop): every input of the core and its answers,
            for replay by ``outpost_core._trace``. For debugging and conformance data only.
    """

    def __init__(
        self,
        *,
        access_token: str | None = None,
        redis_url: str | None = None,
        redis: Redis | RedisCluster | None = None,
        server_url: str | None = None,
        verify: Verify = True,
        snapshot_timeout: float = 5.0,
        max_attempts: int = 10,
        on_dropped: DroppedCallback | None = None,
        telemetry: bool = True,
        clock: Clock | None = None,
        max_in_flight: int = 1,
        batch_size: int = 500,
        linger: float = 0.2,
        requests_per_minute: float = 300.0,
        batch_bytes: int = 8 * 1024 * 1024,
        heartbeat: float = 10.0,
        claim_idle: float = 300.0,
        retry_base: float = 0.5,
        telemetry_url: str | None = None,
        telemetry_interval: float = 30.0,
        durability: str = "primary",
        durability_timeout: float = 1.0,
        record_to: str | os.PathLike[str] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise UsageError("max_in_flight must be at least 1")
        self._tls = tls_context(verify)  # a bundle that cannot be loaded raises here
        self._durability = Durability.of(durability, durability_timeout)
        # What a forked child starts afresh from (the parameters only: nothing else is bound yet).
        self._arguments: dict[str, Any] = {k: v for k, v in locals().items() if k != "self"}
        self._log = logger or logging.getLogger("outpost")
        self._owns_redis = redis is None
        options = ConnectionOptions.resolve(
            os.environ,
            access_token=access_token,
            redis_url=redis_url,
            server_url=server_url,
            telemetry=telemetry,
            telemetry_url=telemetry_url,
        )
        if redis is None:
            redis = _redis_from_url(options.redis_url)
        # On a cluster the driver sends the same commands, one slot per command (one shard's
        # keys, or one outbox stream); only the subscriber, the outbox reads and script loading
        # differ (docs/redis-layout.md, "Redis Cluster").
        self._cluster: RedisCluster | None = redis if isinstance(redis, RedisCluster) else None
        self._redis: Redis = redis  # type: ignore[assignment]
        # Pub/sub ignores numbered databases: name the channels after ours (a cluster has one).
        database = (
            0
            if isinstance(redis, RedisCluster)
            else redis.connection_pool.connection_kwargs.get("db", 0)
        )
        namespace = keys.namespace_of_database(int(database or 0))
        self._channels = keys.all_channels(namespace)
        self._access_token = options.access_token
        self._server_url = options.server_url
        self._traces = Traces(record_to)
        link = None
        if self._access_token:
            link = Link(Target.of(self._server_url), self._access_token, self._traces.rng(0))
        settings = Settings(snapshot_timeout=snapshot_timeout, channel_namespace=namespace)
        self._core = self._traces.session(
            Session(settings, self._log, link), settings, self._server_url if link else None
        )
        self._stream: Stream | None = None
        self._want_open: OpenConnection | None = None
        self._drop_stream = False
        self._consumer = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._delivery_settings = DeliverySettings(
            batch_size=batch_size,
            linger=linger,
            max_attempts=max_attempts,
            claim_idle=claim_idle,
            backoff_base=retry_base,
            channel_namespace=namespace,
            consumer=self._consumer,
            heartbeat=heartbeat,
            requests_per_minute=requests_per_minute,
            batch_bytes=batch_bytes,
        )
        self._max_in_flight = max_in_flight
        self._on_dropped = on_dropped
        self._deliveries: list[Delivery] = []
        self._flushing = 0
        self._settling = 0  # settle scripts running: a flush waits for their replies too
        self._http: httpx.AsyncClient | None = None
        self._telemetry = Telemetry(
            enabled=options.telemetry,
            relay_url=options.telemetry_url,
            token=self._access_token,
            export_interval=telemetry_interval,
            logger=self._log,
            ca_bundle=ca_bundle(verify),
        )
        if self._telemetry.enabled:
            self._core.count_warm_reads()
        self._warm = self._core.warm
        self._clock = clock
        self._shas = SCRIPT_SHA1
        # Scripts and hash reads of many tasks at once go in one pipeline (async; the sync twin
        # sends each as it comes).
        self._batches = CommandBatches(self._redis)
        # A cluster's calls go to one node each, on a connection of its pool: past 100 at once,
        # redis-py refuses them rather than wait. They wait here instead.
        self._node_calls = CallLimit(_NODE_CALLS)
        self._lock = CoreLock()
        self._signal = Signal()
        self._echoes = Echoes()
        self._workers: list[Worker] = []
        self._started = False
        self._closed = False
        self._exit_hook: Callable[[], None] | None = None
        # Each loop that talks to Redis reports an outage once, then once a minute, then its end.
        self._state_outage = Outage("loading state")
        self._subscriber_outage = Outage("the change subscription")

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> AsyncOutpost:
        await self._ensure_started()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _ensure_started(self) -> None:
        if self._started and not self._closed:
            return  # every call passes here: no lock once started
        if self._closed:
            raise OutpostClosed("this Outpost instance is closed")
        with self._lock:
            if self._started:
                return
            self._started = True
        # The core's clock starts now: deadlines set before a first tick would be in the past.
        await self._tick()
        await self._read_cached_configuration()
        self._exit_hook = close_at_exit(self)
        start_afresh_after_fork(self)
        self._workers.append(Worker("outpost-subscriber", self._subscribe_forever))
        if self._telemetry.enabled:
            self._workers.append(Worker("outpost-telemetry", self._telemetry_forever))
        if self._access_token:
            self._workers.append(Worker("outpost-websocket", self._link_loop))
            self._http = httpx.AsyncClient(
                base_url=self._server_url,
                headers={
                    "Authorization": f"Bearer {self._access_token}",
                    "User-Agent": _USER_AGENT,
                },
                timeout=httpx.Timeout(30.0, connect=5.0),
                verify=self._tls,
            )
            for n in range(self._max_in_flight):
                started = time.monotonic()
                delivery = self._traces.delivery(
                    n,
                    Delivery(self._delivery_settings, self._traces.rng(n + 1), started),
                    self._delivery_settings,
                    started,
                )
                self._deliveries.append(delivery)
                loop = self._delivery_loop(delivery, n)
                self._workers.append(Worker(f"outpost-delivery-{n}", loop))
        else:
            self._log.warning(
                "outpost has no access token: events stay queued in Redis until an instance "
                "with a token delivers them"
            )

    async def flush(self, timeout: float = 10.0) -> bool:
        """Deliver every event queued when the call started, by any instance.

        Returns ``True`` once each was delivered or dropped (and reported), ``False`` if some
        were still queued after ``timeout`` seconds (they stay queued, nothing is lost).
        """
        await self._ensure_started()
        marks = await self._outbox_marks()
        deadline = time.monotonic() + timeout
        self._flushing += 1
        self._signal.fire()
        try:
            while True:
                version = self._signal.version
                if not self._settling and await self._outbox_settled(marks):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                await self._signal.wait(version, min(remaining, 0.05))
        finally:
            self._flushing -= 1

    async def close(self, timeout: float = 10.0) -> None:
        """Flush, stop the background work and release connections, within ``timeout`` seconds
        whatever is down (what is not delivered stays queued in Redis). Safe to call twice."""
        if self._closed:
            return
        deadline = time.monotonic() + timeout
        forget_at_exit(self._exit_hook)
        self._telemetry.quiet()  # an exporter failing from here on is one DEBUG line at the end
        try:
            if self._started and self._deliveries:
                # What comes after the flush (workers, the last telemetry export) keeps a reserve.
                with contextlib.suppress(RedisError, OSError):
                    await self.flush(timeout - min(_CLOSE_RESERVE, timeout / 2))
            await self._feed(Closing())  # a close frame to Polar while the socket is still open
        finally:
            self._closed = True
            self._warm = {}  # the core may still cache a read in flight: none is answered now
            self._signal.fire()
            for worker in self._workers:
                await worker.stop(deadline - time.monotonic())
            self._workers.clear()
            if self._deliveries:
                await self._hand_back()
            bound = min(LAST_EXPORT, deadline - time.monotonic())
            with self._lock:
                warm = self._core.warm_reads()
            self._telemetry.shutdown(time.monotonic(), *self._sync_counts(), warm, bound=bound)
        if self._http is not None:
            await self._http.aclose()
        await self._batches.aclose()
        if self._owns_redis:
            await self._redis.aclose()
        self._traces.close()

    def _after_fork(self) -> None:
        """In a forked child (gunicorn --preload, uWSGI): the parent's threads are gone and its
        locks, sockets and copies are not this process's. Start afresh on the next call, as an
        instance built here would."""
        if self._started and not self._closed:
            AsyncOutpost.__init__(self, **self._arguments)

    @property
    def delivery_stalled(self) -> str | None:
        """Why delivery to Polar is stalled (a rejected token, a wrong URL), or ``None``."""
        return next((d.stalled for d in self._deliveries if d.stalled), None)

    @property
    def connected(self) -> bool:
        """Whether the WebSocket to Polar is open. While it is not, warm reads keep answering
        from memory: the local events keep counting, Polar's totals and credits stay as of the
        last snapshot applied (by any instance sharing the Redis)."""
        return self._core.connected

    @property
    def subscribed(self) -> bool:
        """Whether Redis confirmed the subscription to the change channels and it holds: only
        then do warm reads answer from memory (otherwise they read Redis, ``source="redis"``)."""
        return self._core.subscribed

    @property
    def status(self) -> Status:
        """What this instance is connected to, and the last error of each connection."""
        with self._lock:
            return self._core.status(
                redis_error=self._state_outage.error or self._subscriber_outage.error,
                delivery_stalled=self.delivery_stalled,
            )

    @property
    def rejections(self) -> dict[str, int]:
        """How many inputs from peers were rejected, by kind (each was logged)."""
        with self._lock:
            counts = dict(self._core.rejections)
        outbox = sum(d.rejected_entries for d in self._deliveries)
        if outbox:
            counts["outbox_entry"] = outbox
        return counts

    # -- track --------------------------------------------------------------------------------

    async def track(
        self,
        name: str,
        *,
        external_customer_id: str | None = None,
        customer_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        timestamp: datetime | None = None,
        event_id: str | None = None,
    ) -> str:
        """Record one event; return its id (sent to Polar as ``external_id``).

        When this returns, the event is in Redis: every read, on every instance sharing the
        Redis, counts it, and it will reach Polar or be reported to ``on_dropped``.

        Raises:
            InvalidEvent: Polar would refuse the event; nothing was written.
            NotReady: no configuration from Polar within ``snapshot_timeout`` (first start).
            RedisUnavailable: Redis did not answer; whether the event was written is unknown
                only if Redis failed after receiving it, and a retry with the same
                ``event_id`` is then safe.
        """
        await self._ensure_started()
        started = time.perf_counter_ns()
        try:
            return await self._track(
                name, external_customer_id, customer_id, metadata, timestamp, event_id, started
            )
        except BaseException as exc:
            outcome = track_outcome(exc)
            if outcome is not None and self._telemetry.enabled:
                elapsed = time.perf_counter_ns() - started
                self._telemetry.recorder.tracked(
                    external_customer_id, customer_id, (), elapsed, outcome
                )
            raise

    async def _track(
        self,
        name: str,
        external_customer_id: str | None,
        customer_id: str | None,
        metadata: dict[str, Any] | None,
        timestamp: datetime | None,
        event_id: str | None,
        started: int,
    ) -> str:
        now_us = self._now_us()
        timestamp_us = timestamp_us_of(timestamp, now_us)
        event_id = event_id_of(event_id, new_event_id())
        arguments: dict[str, Any] = dict(
            name=name,
            external_customer_id=external_customer_id,
            customer_id=customer_id,
            metadata=metadata,
            timestamp_us=timestamp_us,
            now_us=now_us,
            event_id=event_id,
        )
        try:
            with self._lock:
                run = self._core.track(**arguments)
                ticket = self._echoes.sent()
        except NotReady:
            await self._wait_for_configuration()
            with self._lock:
                run = self._core.track(**arguments)
                ticket = self._echoes.sent()
        wait = self._durability.wait()
        try:
            if wait is None:
                reply = await self._script(run)
            else:
                reply, acknowledged = await self._script_then(run, wait)
        except BaseException:
            with self._lock:
                for data in self._echoes.replied(ticket, None):
                    self._core.handle(ChangePublished(data))  # their effects: the next tick's
            raise
        with self._lock:
            for data in self._echoes.replied(ticket, reply):
                self._core.handle(ChangePublished(data))  # came before the reply: first
            self._core.handle(ScriptReplied(reply))
            effects = self._core.effects()
        if effects:
            await self._run(effects)
        if wait is not None and (shortfall := self._durability.shortfall(acknowledged)):
            raise NotDurable(f"event {event_id} is on the primary only: {shortfall}")
        if self._telemetry.enabled:
            elapsed = time.perf_counter_ns() - started
            self._telemetry.recorder.tracked(
                external_customer_id, customer_id, run.meter_ids, elapsed, semconv.OK, run.buckets
            )
        return event_id

    async def _script(self, run: RunScript) -> Any:
        try:
            return await self._run_script(run.script, run.keys, run.args)
        except RedisError as exc:
            raise RedisUnavailable(f"Redis failed running {run.script}: {exc}") from exc

    async def _script_then(self, run: RunScript, command: tuple[Any, ...]) -> tuple[Any, Any]:
        """The script, then ``command`` on the same connection in the same round trip (WAIT
        counts the replicas that have that connection's writes)."""
        try:
            reply, answer = await self._script_calls(run.script, run.keys, run.args, command)
        except RedisError as exc:
            raise RedisUnavailable(f"Redis failed running {run.script}: {exc}") from exc
        return reply, answer

    async def _script_calls(
        self, name: str, keys: Any, args: Any, *after: tuple[Any, ...]
    ) -> list[Any]:
        """The script ``name`` (EVALSHA, or EVAL where Redis does not hold it), then ``after``,
        on one connection in one round trip: on a cluster, one of the node owning the keys."""
        sha = self._shas[name]
        try:
            return await self._in_one_trip(
                keys[0], ("EVALSHA", sha, len(keys), *keys, *args), *after
            )
        except NoScriptError:
            call = ("EVAL", SCRIPT_TEXT[name], len(keys), *keys, *args)
            return await self._in_one_trip(keys[0], call, *after)

    async def _in_one_trip(self, key: str, *commands: tuple[Any, ...]) -> list[Any]:
        if self._cluster is not None:
            return await self._on_owning_node(self._cluster, key, list(commands))
        pipeline: Any = self._redis.pipeline(transaction=False)
        async with pipeline as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute())

    async def _on_owning_node(
        self, cluster: RedisCluster, key: str, commands: list[tuple[Any, ...]]
    ) -> list[Any]:
        """``commands`` on one connection of the node that owns ``key``, in one round trip,
        following ASK (with ``ASKING`` on that same connection) and MOVED here: redis-py's async
        cluster client may send ``ASKING`` and the command on two connections, and its pipeline
        may send a redirected call to another node than the command after it."""
        node = _owner(cluster, key)
        asking: list[tuple[Any, ...]] = []
        for _ in range(_REDIRECTIONS):
            try:
                async with self._node_calls:
                    replies = await run_on_node(cluster, node, [*asking, *commands])
            except (RedisConnectionError, TimeoutError, OSError):
                await cluster.nodes_manager.initialize()
                node, asking = _owner(cluster, key), []
                continue
            replies = replies[len(asking) :]
            first = replies[0]
            if isinstance(first, AskError):  # the slot is migrating and the keys left already
                target = cluster.get_node(first.host, first.port)  # type: ignore[no-untyped-call,unused-ignore]
                if target is None:
                    raise first
                node, asking = target, [("ASKING",)]
            elif isinstance(first, MovedError | TryAgainError):
                await cluster.nodes_manager.initialize()
                node, asking = _owner(cluster, key), []
            else:
                for reply in replies:
                    if isinstance(reply, Exception):
                        raise reply
                return replies
        raise RedisConnectionError(f"the slot of {key} kept moving")

    async def _run_script(self, name: str, keys: Any, args: Any) -> Any:
        if self._cluster is None:
            # EVALSHA straight on the client: redis-py's Script object adds a layer of calls to
            # every track(). EVAL where Redis does not hold the script (restarted, flushed)
            # caches it again.
            try:
                return await self._batches.execute(
                    "EVALSHA", self._shas[name], len(keys), *keys, *args
                )
            except NoScriptError:  # as many tasks at once as got it: each goes in the batches
                return await self._batches.execute(
                    "EVAL", SCRIPT_TEXT[name], len(keys), *keys, *args
                )
        # redis-py's reload after NOSCRIPT loads the script on every primary, and fails while
        # one is down: EVAL runs it on the node that owns the keys, and caches it there.
        (reply,) = await self._script_calls(name, keys, args)
        return reply

    async def _wait_for_configuration(self) -> None:
        deadline = time.monotonic() + self._core.settings.snapshot_timeout
        while self._core.configuration is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                with self._lock:
                    reason = self._core.unconfigured_reason()
                raise NotReady(f"{reason}: cannot tell which meters count the event")
            version = self._signal.version
            await self._read_cached_configuration()
            await self._signal.wait(version, min(remaining, _RECHECK))

    # -- balance ------------------------------------------------------------------------------

    async def balance(
        self,
        meter_id: str,
        *,
        external_customer_id: str | None = None,
        customer_id: str | None = None,
        fresh: bool = False,
    ) -> Balance:
        """The customer's balance of a meter, from memory once warm.

        The first read of a customer waits for its state (and Polar's snapshot) up to
        ``snapshot_timeout``; later reads cost no network call while this instance follows
        Redis's changes. When it does not (its subscription is down), a read costs one Redis
        round trip instead, and ``Balance.source`` says ``"redis"``. ``fresh=True`` always
        reads Redis: never behind what any instance tracked before the call.

        Raises:
            NotReady: no snapshot within ``snapshot_timeout`` (the message says why).
            UnknownMeter / UnsupportedMeter: the meter cannot be read locally.
            RedisUnavailable: the read had to go to Redis, and Redis did not answer.
        """
        if not fresh:  # the warm path: Session.cached_balance, inlined
            try:
                customer = (
                    external_customer_id
                    if customer_id is None
                    else (external_customer_id, customer_id)
                )
                cached = self._warm[customer][meter_id]
            except (KeyError, TypeError):  # TypeError: an unhashable argument, refused below
                pass
            else:
                cached.hits += 1  # counted for telemetry, not timed
                return cached.balance
        if self._closed:  # a closed instance reads nothing warm either: close() empties _warm
            raise OutpostClosed("this Outpost instance is closed")
        if not self._telemetry.enabled:
            return await self._balance_when_ready(
                meter_id, external_customer_id, customer_id, fresh
            )
        started = time.perf_counter_ns()
        error: BaseException | None = None
        try:
            return await self._balance_when_ready(
                meter_id, external_customer_id, customer_id, fresh
            )
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._telemetry.recorder.read(
                (meter_id, external_customer_id, customer_id),
                time.perf_counter_ns() - started,
                read_outcome(error),
            )

    async def _balance_when_ready(
        self,
        meter_id: str,
        external_customer_id: str | None,
        customer_id: str | None,
        fresh: bool = False,
    ) -> Balance:
        await self._ensure_started()
        deadline = time.monotonic() + self._core.settings.snapshot_timeout
        while True:
            version = self._signal.version
            remaining = deadline - time.monotonic()
            with self._lock:
                # At the deadline, a copy still waiting for the subscription reads Redis.
                found = self._core.read(
                    meter_id, external_customer_id, customer_id, fresh=fresh or remaining <= 0
                )
                effects = self._core.effects()
            if effects:
                # Run them whatever the read found: some may have been queued by another
                # thread or task, and dropping them would leave their flow waiting for good.
                await self._run(effects)
            if isinstance(found, Fetch):
                fetched = await self._fetch(found, meter_id, external_customer_id, customer_id)
                if fetched is not None:
                    return fetched
            elif found is not None:
                return found
            elif effects:
                continue
            if remaining <= 0:
                with self._lock:
                    reason = self._core.not_ready_reason(
                        meter_id, external_customer_id, customer_id
                    )
                raise NotReady(f"{reason} after {self._core.settings.snapshot_timeout} s")
            if self._core.configuration is None:
                await self._read_cached_configuration()
            await self._signal.wait(version, min(remaining, _RECHECK))

    async def _fetch(
        self,
        fetch: Fetch,
        meter_id: str,
        external_customer_id: str | None,
        customer_id: str | None,
    ) -> Balance | None:
        """A read that must not come from memory: one ``HGETALL`` per key of the customer and
        its aliases, in one round trip, computed by the core."""
        try:
            fields = await self._hgetall_each(fetch.keys)
        except RedisConnectionError:
            try:  # once more: a pooled connection may predate a Redis restart
                fields = await self._hgetall_each(fetch.keys)
            except RedisError as exc:
                raise RedisUnavailable(f"Redis failed reading {fetch.keys}: {exc}") from exc
        except RedisError as exc:
            raise RedisUnavailable(f"Redis failed reading {fetch.keys}: {exc}") from exc
        with self._lock:
            found = self._core.read_fetched(meter_id, external_customer_id, customer_id, fields)
            effects = self._core.effects()
        if effects:
            await self._run(effects)
        return found

    async def _hgetall_each(self, keys: tuple[str, ...]) -> dict[str, dict[Any, Any]]:
        if len(keys) == 1:  # the common case: no pipeline to build
            return {keys[0]: await self._batches.execute("HGETALL", keys[0])}
        replies = await self._batches.execute_all(*(("HGETALL", key) for key in keys))
        return dict(zip(keys, replies, strict=True))

    # -- driving the core ---------------------------------------------------------------------

    async def _run(self, effects: list[Effect]) -> None:
        """Run effects, and those their outcomes cause, until the core asks for nothing more."""
        while effects:
            for index, effect in enumerate(effects):
                try:
                    await self._run_one(effect)
                except BaseException:
                    # Cancelled (or failed) midway: what was not started goes back to the core,
                    # for the next loop that drains it. The core's deadlines cover the one lost.
                    with self._lock:
                        for later in effects[index + 1 :]:
                            self._core.emit(later)
                    raise
            with self._lock:
                effects = self._core.effects()
        with self._lock:
            seen = self._core.observations()
        if seen:
            self._telemetry.observe(seen)
        self._signal.fire()

    async def _run_one(self, effect: Effect) -> None:
        await _SESSION_EFFECTS[type(effect)](self, effect)

    async def _store_configuration(self, effect: StoreConfiguration) -> None:
        try:
            await self._redis.set(effect.key, effect.text)
        except RedisError as exc:
            self._log.debug("outpost could not cache the configuration: %s", exc)

    async def _run_script_effect(self, effect: RunScript) -> None:
        try:
            reply = await self._script(effect)
        except RedisUnavailable as exc:
            self._redis_failed(self._state_outage, exc)
            if effect.tag is not None:
                with self._lock:
                    self._core.handle(ScriptFailed(effect.tag))
            return
        self._redis_answered(self._state_outage)
        with self._lock:
            self._core.handle(ScriptReplied(reply, effect.tag))
        self._echoes.expect(reply)

    async def _send_bytes(self, effect: SendBytes) -> None:
        await self._send(effect.data)

    async def _open_connection(self, effect: OpenConnection) -> None:
        self._want_open = effect  # the link loop opens it

    async def _close_connection(self, effect: CloseConnection) -> None:
        self._drop_stream = True  # the link loop closes it

    def _redis_failed(self, outage: Outage, exc: BaseException) -> float:
        """Count a Redis failure of one loop; log what the outage says; return the delay."""
        with self._lock:
            delay, report = outage.failed(time.monotonic(), str(exc), random.random())
        _log_report(self._log, report)
        return delay

    def _redis_answered(self, outage: Outage) -> None:
        if outage.down:
            with self._lock:
                report = outage.succeeded(time.monotonic())
            _log_report(self._log, report)

    async def _send(self, data: bytes) -> None:
        stream = self._stream
        if stream is None:
            return  # the link dropped: what was asked is asked again on reconnect
        try:
            await stream.send(data)
        except OSError as exc:
            self._log.warning("outpost could not write to the WebSocket: %s", exc)
            await self._feed(ConnectionFailed(time.monotonic(), f"could not write: {exc}"))

    async def _list_pending(self, effect: ListPending) -> None:
        try:
            replies = await self._batches.execute_all(*(("HKEYS", key) for key in effect.keys))
            fields = {key: list(names) for key, names in zip(effect.keys, replies, strict=True)}
        except RedisError as exc:
            self._redis_failed(self._state_outage, exc)
            with self._lock:
                self._core.handle(ListFailed(effect.tag))
            return
        self._redis_answered(self._state_outage)
        with self._lock:
            self._core.handle(PendingListed(effect.tag, fields))

    async def _link_loop(self) -> None:
        """Keep the WebSocket to Polar open and move its bytes to and from the core."""
        while not self._closed:
            await self._tick()
            want, self._want_open = self._want_open, None
            if want is None:
                # Sleep until the core's next deadline; an OpenConnection handed over by another
                # loop meanwhile changes the signal's version and wakes this one.
                version = self._signal.version
                if self._want_open is None:
                    await self._signal.wait(version, self._until_deadline())
                continue
            try:
                tls = self._tls if want.tls else None
                stream = await open_stream(want.host, want.port, tls, timeout=want.timeout)
            except (OSError, TimeoutError) as exc:
                reason = cannot_connect(exc, want.host, want.port)
                await self._feed(ConnectionFailed(time.monotonic(), reason))
                continue
            self._stream, self._drop_stream = stream, False
            try:
                await self._feed(ConnectionOpened(time.monotonic()))
                while not self._closed and not self._drop_stream:
                    data = await stream.receive(self._until_deadline())
                    if data is None:
                        await self._tick()
                    else:
                        await self._feed(BytesReceived(time.monotonic(), data))
                        if not data:
                            break
            except (OSError, TimeoutError) as exc:
                await self._feed(ConnectionFailed(time.monotonic(), f"connection lost: {exc}"))
            finally:
                self._stream = None
                await stream.close()

    async def _feed(self, event: Any) -> None:
        with self._lock:
            self._core.handle(event)
            effects = self._core.effects()
        if effects or not isinstance(event, Tick):  # a quiet tick changes nothing to wake for
            await self._run(effects)

    async def _tick(self) -> None:
        await self._feed(Tick(time.monotonic(), self._now_us()))

    def _until_deadline(self) -> float:
        with self._lock:  # the sync driver's other threads change the flows it looks at
            deadline = self._core.next_deadline()
        if deadline is None:
            return _POLL
        return min(max(deadline - time.monotonic(), 0.0), _POLL)

    async def _load(self, effect: LoadIdentity) -> None:
        try:
            fields = await self._batches.execute("HGETALL", effect.key)
        except RedisError as exc:
            self._redis_failed(self._state_outage, exc)
            with self._lock:
                self._core.handle(LoadFailed(effect.key, effect.load_id))
            return
        self._redis_answered(self._state_outage)
        with self._lock:
            self._core.handle(IdentityLoaded(effect.key, fields, effect.load_id))

    async def _read_cached_configuration(self) -> None:
        try:
            text = await self._redis.get(CONFIGURATION_KEY)
        except RedisError as exc:
            self._redis_failed(self._state_outage, exc)
            return
        if text is None:
            return
        try:
            payload = json.loads(text)
        except ValueError:
            payload = text
        with self._lock:
            self._core.handle(ConfigurationReceived(payload, from_cache=True))
            effects = self._core.effects()
        await self._run(effects)

    async def _subscribe_forever(self) -> None:
        """Follow every shard's change channel; after any (re)subscription, reload the copies."""
        if self._cluster is not None:
            await self._subscribe_to_cluster(self._cluster)
            return
        while not self._closed:
            pubsub = open_pubsub(self._redis)
            try:
                await pubsub.ssubscribe(*self._channels)
                while not self._closed:
                    news, heard = await self._hear(pubsub, _POLL)
                    if heard and not news:
                        continue  # only echoes
                    await self._subscriber_news(news, heard)
            except (RedisError, OSError) as exc:
                with self._lock:
                    self._core.handle(SubscriberLost())
                if not self._closed:
                    await sleep(self._redis_failed(self._subscriber_outage, exc))
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await close_pubsub(pubsub)

    async def _hear(self, pubsub: Any, timeout: float) -> tuple[list[_News], bool]:
        """What a subscription brought within ``timeout``, and whether anything came: each
        change published that is not an echo ``seen()`` recognises, as it came, and redis-py's
        message of any other reply. Raw replies, not redis-py's messages, so that this
        instance's own changes (already applied from the scripts' replies) are dropped before
        anything is made of them: the echo of every track() costs the least it can."""
        responses = await read_pubsub(pubsub, timeout, self._is_echo)
        news: list[_News] = []
        for response in responses:
            change = published_data(response)
            if change is None:  # a subscription's confirmation or end, a health check
                news.append((None, await pubsub.handle_message(response)))
            elif not self._echoes.seen(change):
                news.append((change, None))
        return news, bool(responses)

    def _is_echo(self, response: object) -> bool:
        """Whether a raw reply is the echo of this instance's own change (forgotten if so)."""
        change = published_data(response)
        return change is not None and self._echoes.seen(change)

    def _news_to_core(
        self, news: list[_News], message_to_core: Callable[[dict[str, Any]], None]
    ) -> bool:
        """Hand the core what :meth:`_hear` heard, in order, under the lock; whether anything
        reached it (a change held as maybe the echo of a script in flight does not)."""
        reached = False
        for change, message in news:
            if change is None:
                reached = True
                if message is not None:
                    message_to_core(message)
            elif not self._echoes.hold(change):
                self._core.handle(ChangePublished(change))  # as it came: no redis-py message
                reached = True
        return reached

    async def _subscriber_news(self, news: list[_News], heard: bool) -> None:
        """What the subscription heard to the core, then tick it and run what it asks for."""
        with self._lock:
            # A quiet poll still ticks the core; changes that were all held do not.
            if not self._news_to_core(news, self._message_to_core) and heard:
                return
            self._core.handle(Tick(time.monotonic(), self._now_us()))
            effects = self._core.effects()
        if effects or heard:
            await self._run(effects)

    async def _subscribe_to_cluster(self, cluster: RedisCluster) -> None:
        """One sharded subscription per node, for the channels of the shards it owns now, each
        read by a worker of its own (so a message is taken as soon as it comes, whichever node
        sends it). A break (its node failed, a slot moved away) loses that node's channels only:
        the core stops their copies following, and reloads them once each channel is subscribed
        again on its owner; the other shards' copies keep following. This loop looks at the slot
        map after a break and every ``_TOPOLOGY_CHECK`` seconds (a subscriber does not follow a
        fail-over or a migration by itself: docs/redis-layout.md, "Redis Cluster")."""
        nodes: dict[str, _NodeSubscription] = {}
        look_at = 0.0  # when to look at the slot map next
        try:
            while not self._closed:
                version = self._signal.version
                for name, node in list(nodes.items()):
                    if node.failure is not None:
                        await self._lose_node(nodes, name)
                        self._redis_failed(self._subscriber_outage, node.failure)
                        look_at = min(look_at, time.monotonic() + _CLUSTER_POLL * 5)
                if time.monotonic() >= look_at:
                    look_at = time.monotonic() + _TOPOLOGY_CHECK
                    try:
                        await self._follow_slot_map(cluster, nodes)
                    except (RedisError, OSError) as exc:
                        look_at = time.monotonic() + self._redis_failed(
                            self._subscriber_outage, exc
                        )
                with self._lock:
                    held = sum(len(node.channels) for node in nodes.values())
                if held < len(self._channels):  # a channel given away: find its new owner
                    look_at = min(look_at, time.monotonic() + _CLUSTER_POLL * 5)
                await self._feed(Tick(time.monotonic(), self._now_us()))
                await self._signal.wait(version, max(0.0, min(look_at - time.monotonic(), _POLL)))
        finally:
            for node in nodes.values():
                node.stopped = True
            for node in nodes.values():
                await node.worker.stop(_POLL)
                with contextlib.suppress(RedisError, OSError):
                    await close_node_pubsub(node.pubsub)

    async def _follow_slot_map(
        self, cluster: RedisCluster, nodes: dict[str, _NodeSubscription]
    ) -> None:
        """Hand each channel to the worker of the node that owns its slot now: a node whose
        channels moved away gives them up (their copies stop following), a node that gained
        some subscribes them; a node without a worker gets one."""
        await cluster.nodes_manager.initialize()  # the slot map as the cluster sees it now
        owners = self._channel_owners(cluster)
        held: set[str] = set()
        for name, node in nodes.items():
            with self._lock:
                moved = {c for c in node.channels if owners[c].name != name}
                node.channels -= moved
                node.to_unsubscribe |= moved
                if moved:
                    self._core.handle(ChannelsLost(tuple(sorted(moved))))
                held |= node.channels
        for channel in sorted(set(self._channels) - held):
            owner = owners[channel]
            subscription = nodes.get(owner.name)
            if subscription is None:
                subscription = _NodeSubscription(open_node_pubsub(cluster, owner))
                loop = self._node_loop(subscription)
                subscription.worker = Worker(f"outpost-subscriber-{owner.name}", loop)
                nodes[owner.name] = subscription
            with self._lock:
                subscription.channels.add(channel)
                subscription.to_subscribe.add(channel)

    def _node_loop(self, node: _NodeSubscription) -> Callable[[], Any]:
        """One node's subscription: (un)subscribe what the slot map says, then wait for its
        messages. Only this worker touches the node's connection."""

        async def loop() -> None:
            try:
                while not self._closed and not node.stopped:
                    with self._lock:
                        add, node.to_subscribe = node.to_subscribe, set()
                        remove, node.to_unsubscribe = node.to_unsubscribe, set()
                    if remove:
                        await node.pubsub.sunsubscribe(*sorted(remove))
                    for channel in sorted(add):
                        await node.pubsub.ssubscribe(channel)  # one slot per command
                    await self._take_node_messages(node)
            except Exception as exc:  # a Redis error, or redis-py failing under a fail-over
                node.failure = exc
                self._signal.fire()

        return loop

    async def _take_node_messages(self, node: _NodeSubscription) -> None:
        """What one node's subscription brought, to the core, as on a single Redis."""
        news, _ = await self._hear(node.pubsub, _NODE_POLL)
        if not news:
            return
        with self._lock:
            self._news_to_core(news, functools.partial(self._node_message_to_core, node))
            effects = self._core.effects()
        self._subscriber_back()
        await self._run(effects)

    def _node_message_to_core(self, node: _NodeSubscription, message: dict[str, Any]) -> None:
        kind = text_of(message.get("type"))
        channel = text_of(message.get("channel"))
        if kind == "ssubscribe":
            if channel in node.channels:
                self._core.handle(ChannelSubscribed(channel))
        elif kind == "sunsubscribe":
            if channel in node.channels:  # not ours: the node gave the slot away
                node.channels.discard(channel)
                self._core.handle(ChannelsLost((channel,)))
                self._signal.fire()  # the topology loop looks for its new owner
        else:
            self._message_to_core(message)

    async def _lose_node(self, nodes: dict[str, _NodeSubscription], name: str) -> None:
        node = nodes.pop(name)
        node.stopped = True
        with self._lock:
            lost, node.channels = node.channels, set()
            self._core.handle(ChannelsLost(tuple(sorted(lost))))
        await node.worker.stop(_POLL)
        with contextlib.suppress(RedisError, OSError):
            await close_node_pubsub(node.pubsub)

    def _channel_owners(self, cluster: RedisCluster) -> dict[str, Any]:
        """Which node serves each shard channel, as this client's slot map says."""
        return {channel: _owner(cluster, channel) for channel in self._channels}

    def _subscriber_back(self) -> None:
        if self._core.subscribed and self._subscriber_outage.down:
            _log_report(self._log, self._subscriber_outage.succeeded(time.monotonic()))

    # -- delivery -----------------------------------------------------------------------------

    def _delivery_loop(self, delivery: Delivery, number: int) -> Callable[[], Any]:
        outage = Outage(f"delivery {number}")

        async def loop() -> None:
            await self._retrying(outage, self._create_groups, None)  # Redis may be down at start
            while not self._closed:
                delivery.flushing = self._flushing > 0
                action = delivery.next_effect(time.monotonic())
                outcome = await self._act(outage, action)
                delivery.handle(outcome, time.monotonic(), self._now_us())
                for report in delivery.reports():
                    _log_report(self._log, report)
                if isinstance(outcome, Settled):
                    self._signal.fire()

        return loop

    async def _act(self, outage: Outage, action: DeliveryEffect) -> DeliveryInput:
        """Do one delivery action. Redis failures are retried until they succeed (or the instance
        closes): settling must not be skipped, and a read can simply wait."""
        return await self._retrying(outage, lambda: self._act_once(action), nothing_done(action))

    async def _retrying(self, outage: Outage, call: Callable[[], Awaitable[_T]], closing: _T) -> _T:
        """``call()`` until Redis answers, backing off; ``closing`` (nothing done, the work stays
        queued in Redis) once the instance is closing."""
        while True:
            try:
                result = await call()
            except (RedisError, OSError) as exc:
                if self._closed:
                    return closing
                if isinstance(exc, ResponseError) and lost_its_data(str(exc)):
                    # Redis lost its data (restart without AOF, FLUSHDB). A failure here is
                    # retried too.
                    with contextlib.suppress(RedisError, OSError):
                        await self._create_groups()
                    await sleep(0.05)
                else:
                    await sleep(self._redis_failed(outage, exc))
                continue
            self._redis_answered(outage)
            return result

    async def _act_once(self, action: DeliveryEffect | ForgetHeartbeat) -> DeliveryInput:
        result: DeliveryInput = await _DELIVERY_EFFECTS[type(action)](self, action)
        return result

    async def _read_outbox(self, action: ReadOutbox) -> DeliveryInput:
        if self._cluster is not None:
            return await self._read_outboxes_one_by_one(action)
        block = int(action.block * 1000)
        if block <= 0:  # a lingering batch's read for more: with the scripts, read as it came
            reply = await self._batches.execute(
                *_read_outboxes(self._consumer, action.count), parsed=False
            )
            return OutboxRead(stream_entries(reply))
        reply = await self._redis.xreadgroup(
            GROUP,
            self._consumer,
            dict.fromkeys(keys.ALL_OUTBOXES, ">"),
            count=action.count,
            block=block,
        )
        return OutboxRead(stream_entries(reply))

    async def _settle(self, action: SettleScript) -> DeliveryInput:
        # Told which revisions this instance holds, the script replies with what changed, so
        # this instance's copies (and a flush() waiting on them) see it at once.
        with self._lock:
            action = with_known_revs(action, self._core.known_rev)
        self._settling += 1
        try:
            reply = await self._run_script(action.script, action.keys, action.args)
            with self._lock:
                self._core.handle(ScriptReplied(reply))
                effects = self._core.effects()
            self._echoes.expect(reply)  # applied: its echo, if it has not come yet, is dropped
            await self._run(effects)
        finally:
            self._settling -= 1
        return Settled(reply)

    async def _report_dropped(self, action: ReportDropped) -> DeliveryInput:
        if self._on_dropped is None:
            self._log.error("outpost dropped %d events: %s", len(action.events), action.reason)
        else:
            try:
                await call_back(self._on_dropped, list(action.events), action.reason)
            except Exception:
                self._log.exception("outpost: on_dropped raised")
        return Reported()

    async def _refresh_claim(self, action: RefreshClaim) -> DeliveryInput:
        for stream, ids in action.by_stream().items():
            claimed: list[Any] = ids  # redis-py's stub wants a list of its own union
            await self._redis.xclaim(stream, GROUP, self._consumer, 0, claimed, justid=True)
        return Done()

    async def _claim_stale(self, action: ClaimStale) -> DeliveryInput:
        entries: list[StreamEntry] = []
        for stream in keys.ALL_OUTBOXES:
            reply = await self._redis.xautoclaim(
                stream,
                GROUP,
                self._consumer,
                int(action.min_idle * 1000),
                start_id="0-0",
                count=action.count,
            )
            entries += claimed_entries(stream, reply)
        return OutboxRead(entries)

    async def _beat(self, action: Beat) -> DeliveryInput:
        await self._redis.set(action.key, b"1", px=action.ttl_ms)
        return Done()

    async def _survey(self, action: SurveyConsumers) -> DeliveryInput:
        listing: list[tuple[str, Any]] = []
        for stream in keys.ALL_OUTBOXES:
            listing.append((stream, await self._redis.xinfo_consumers(stream, GROUP)))
        return ConsumersListed(listing)

    async def _check_heartbeats(self, action: CheckHeartbeats) -> DeliveryInput:
        return HeartbeatsChecked(await self._redis.mget(action.keys))

    async def _reclaim(self, action: Reclaim) -> DeliveryInput:
        args = [GROUP, action.taker, str(action.count), *action.consumers]
        reply = await self._run_script("reclaim", (action.stream,), args)
        return Reclaimed(action.stream, reply)

    async def _take_request(self, action: TakeRequest) -> DeliveryInput:
        args = [str(action.per_minute), str(action.capacity), ""]  # "": Redis's clock
        reply = await self._run_script("budget", (action.key,), args)
        return BudgetAnswered(reply)

    async def _forget_heartbeat(self, action: ForgetHeartbeat) -> DeliveryInput:
        await self._redis.delete(action.key)
        return Done()

    async def _sleep(self, action: Sleep) -> DeliveryInput:
        version = self._signal.version
        await self._signal.wait(version, min(action.until - time.monotonic(), _POLL))
        return Done()

    async def _read_outboxes_one_by_one(self, action: ReadOutbox) -> DeliveryInput:
        """A cluster refuses one read across slots: each shard's stream is read on its own, and
        an empty round waits a little before the next (no blocking read spans the streams)."""
        entries: list[StreamEntry] = []
        start = random.randrange(len(keys.ALL_OUTBOXES))  # no shard always read first
        for offset in range(len(keys.ALL_OUTBOXES)):
            stream = keys.ALL_OUTBOXES[(start + offset) % len(keys.ALL_OUTBOXES)]
            left = action.count - len(entries)
            if left <= 0:
                break
            reply = await self._redis.xreadgroup(GROUP, self._consumer, {stream: ">"}, count=left)
            entries += stream_entries(reply)
        if not entries and action.block > 0:
            version = self._signal.version
            await self._signal.wait(version, min(action.block, _CLUSTER_POLL * 5))
        return OutboxRead(entries)

    async def _post(self, action: PostBatch) -> DeliveryInput:
        assert self._http is not None
        try:
            response = await self._http.post(
                "/v1/events/ingest",
                content=action.body,
                headers={"Content-Type": "application/json"},
            )
        except httpx.ProxyError as exc:  # the proxy refused the tunnel: nothing reached Polar
            reason = f"the proxy refused the tunnel to Polar: {exc}"
            return BatchFailed(reason, maybe_sent=False, stalls=True)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            untrusted = describe(exc, self._http.base_url.host)
            if untrusted is not None:  # no retry fixes it: delivery stalls and says why
                return BatchFailed(untrusted, maybe_sent=False, stalls=True)
            return BatchFailed(f"could not connect to Polar: {exc!r}", maybe_sent=False)
        except httpx.HTTPError as exc:
            return BatchFailed(f"ingestion request failed: {exc!r}", maybe_sent=True)
        wait = retry_after(response.headers.get("Retry-After"), self._now_us())
        return BatchAnswered(response.status_code, response.content, wait)

    async def _hand_back(self) -> None:
        """Once the loops stopped: this instance's heartbeat goes, so other instances take what
        it still holds at their next survey, and it leaves the group where it holds nothing."""
        try:
            for action in hand_back(self._consumer):
                await self._act_once(action)
        except (RedisError, OSError) as exc:
            self._log.warning(
                "outpost could not hand back its outbox entries (others take them once its "
                "heartbeat expires): %s",
                exc,
            )

    async def _create_groups(self) -> None:
        for stream in keys.ALL_OUTBOXES:
            try:
                await self._redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def _outbox_marks(self) -> dict[str, bytes | str]:
        marks: dict[str, bytes | str] = {}
        for stream in keys.ALL_OUTBOXES:
            last = await self._redis.xrevrange(stream, count=1)
            if last and last[0][0] is not None:
                marks[stream] = last[0][0]
        return marks

    async def _outbox_settled(self, marks: dict[str, bytes | str]) -> bool:
        for stream, mark in marks.items():
            if await self._redis.xrange(stream, max=mark, count=1):
                return False
        return True

    async def _telemetry_forever(self) -> None:
        """Telemetry's slow work, on a thread of its own (this worker's in the sync driver, one of
        the loop's pool in the async one): starting the relay's exporters, the first of which
        imports OpenTelemetry's SDK (about 70 ms), and recording each second what the hot paths
        buffered (about 8 µs a track: 28 ms for 3,500). The subscriber did it, and the changes it
        was to apply waited meanwhile; in the async driver every task waited."""
        telemetry = self._telemetry
        while not self._closed:
            configuration = self._core.configuration
            organization = configuration.organization_id if configuration is not None else None
            if organization is not None and not telemetry.exporting:
                await run_blocking(telemetry.export_to_relay, organization)
            now = time.monotonic()
            if telemetry.due(now):
                with self._lock:
                    warm = self._core.warm_reads()
                await run_blocking(telemetry.flush, now, *self._sync_counts(), warm)
            await sleep(_TELEMETRY_TICK)

    def _sync_counts(self) -> tuple[int, int]:
        remote = self._core.remote
        if remote is None:
            return (0, 0)
        return (remote.snapshots_received, remote.snapshots_applied)

    def _message_to_core(self, message: dict[str, Any]) -> None:
        """One message of the subscription, to the core (which decides what it means)."""
        kind = message.get("type")
        if kind in ("smessage", b"smessage"):
            self._core.handle(ChangePublished(message.get("data")))
        elif kind in ("ssubscribe", b"ssubscribe") and isinstance(message.get("data"), int):
            self._core.handle(SubscriptionConfirmed(message["data"]))
            self._subscriber_back()

    def _now_us(self) -> int:
        if self._clock is None:
            return time.time_ns() // 1000
        return to_us(self._clock.now())


# The driver is two dispatch tables: each effect the core asks for, and the method that does it
# and reports what came of it. An effect missing here fails at once (KeyError), in any test.
_SESSION_EFFECTS: dict[type, Callable[[AsyncOutpost, Any], Awaitable[None]]] = {
    LoadIdentity: AsyncOutpost._load,
    StoreConfiguration: AsyncOutpost._store_configuration,
    RunScript: AsyncOutpost._run_script_effect,
    SendBytes: AsyncOutpost._send_bytes,
    ListPending: AsyncOutpost._list_pending,
    OpenConnection: AsyncOutpost._open_connection,
    CloseConnection: AsyncOutpost._close_connection,
}
_DELIVERY_EFFECTS: dict[type, Callable[[AsyncOutpost, Any], Awaitable[DeliveryInput]]] = {
    ReadOutbox: AsyncOutpost._read_outbox,
    PostBatch: AsyncOutpost._post,
    SettleScript: AsyncOutpost._settle,
    ReportDropped: AsyncOutpost._report_dropped,
    RefreshClaim: AsyncOutpost._refresh_claim,
    ClaimStale: AsyncOutpost._claim_stale,
    Beat: AsyncOutpost._beat,
    SurveyConsumers: AsyncOutpost._survey,
    CheckHeartbeats: AsyncOutpost._check_heartbeats,
    Reclaim: AsyncOutpost._reclaim,
    TakeRequest: AsyncOutpost._take_request,
    ForgetHeartbeat: AsyncOutpost._forget_heartbeat,
    Sleep: AsyncOutpost._sleep,
}


def _owner(cluster: RedisCluster, key: str) -> Any:
    """The node that serves ``key``'s slot, as the client's slot map says."""
    node = cluster.get_node_from_key(key)  # type: ignore[no-untyped-call,unused-ignore]
    if node is None:
        raise RedisConnectionError(f"no node serves {key}")
    return node


def _redis_from_url(url: str) -> Redis | RedisCluster:
    """``redis+cluster://host:port`` (or ``rediss+cluster://``) names a cluster by any of its
    nodes; any other URL, one Redis."""
    node = cluster_node_url(url)
    if node is not None:
        return RedisCluster.from_url(node)
    return own_client(url)


@attrs.define
class _NodeSubscription:
    """A cluster node's pub/sub connection, read by a worker of its own; the shard channels it
    holds (subscribed, or asked for), and what its worker has yet to (un)subscribe."""

    pubsub: Any
    channels: set[str] = attrs.field(factory=set)
    to_subscribe: set[str] = attrs.field(factory=set)
    """Channels given to this node that its worker has not subscribed yet."""
    to_unsubscribe: set[str] = attrs.field(factory=set)
    worker: Any = None
    stopped: bool = False
    failure: BaseException | None = None
    """Why its connection broke (the worker stopped); the topology loop then loses it."""


def _read_outboxes(consumer: str, count: int) -> tuple[Any, ...]:
    """XREADGROUP of what no consumer has read yet from every outbox, without blocking (a
    blocking read would hold up every command behind it on a shared connection)."""
    outboxes = keys.ALL_OUTBOXES
    return (
        "XREADGROUP",
        "GROUP",
        GROUP,
        consumer,
        "COUNT",
        count,
        "STREAMS",
        *outboxes,
        *(">",) * len(outboxes),
    )


_News = tuple[object, dict[str, Any] | None]
"""What a subscription heard: a change published (its data, as it came), or redis-py's message
of another reply (``None`` when redis-py makes none of it)."""


def _log_report(log: logging.Logger, report: Report | None) -> None:
    if report is not None:
        log.log(report.level, report.message)
