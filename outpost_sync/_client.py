# GENERATED from outpost_async/_client.py by scripts/unasync.py: do not edit.
"""The public client, ``Outpost``: its lifecycle, ``track()`` and ``balance()``.

The asyncio driver is written once, in the modules of this package; the threaded driver's modules
are generated from them by ``scripts/unasync.py`` (edit the async ones, then regenerate). The
driver is thin: it moves replies and messages between Redis and the sans-IO
``outpost_core.Session`` and runs the effects the session asks for. Anything that decides what an
input means lives in the core. The parts share one ``DriverContext`` (``_context.py``):

- ``_effects.py``: feeding the session and running its effects (and the effects worker);
- ``_subscriber.py`` and ``_cluster.py``: the change subscription (one Redis; a cluster's nodes);
- ``_delivery.py``: the delivery loops (``_outbox.py``: the outbox streams' other commands;
  ``_ingest.py``: posting to Polar's ingestion API); ``_websocket.py``: the link to Polar;
- ``_telemetry.py``: the telemetry worker; ``_scripts.py``: running the Lua scripts;
- ``_reads.py``: a read that waits or goes to Redis; ``_tracking.py``: writing one event;
- ``_reservation.py``: reservations and ``track(require_balance=True)``;
- ``_lifecycle.py``: starting the workers on the first call, stopping them at close;
  ``_supervisor.py``: restarting a worker that failed.

``_backend.py`` (and, async only, ``_multiplexed.py`` and ``_listener.py``) are each driver's own,
written by hand.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs
from redis import Redis
from redis.cluster import RedisCluster

from outpost_core import (
    DEFAULT_SHARDS,
    Balance,
    ConnectionOptions,
    DeliverySettings,
    Durability,
    OutpostClosed,
    Status,
    read_outcome,
    require_positive,
    require_whole,
    track_outcome,
)
from outpost_core import shards as deployment
from outpost_io.tls import Verify, ca_bundle, tls_context
from outpost_sync._context import Clock, DroppedCallback, open_context
from outpost_sync._delivery import Deliveries
from outpost_sync._effects import SessionEffects
from outpost_sync._lifecycle import Lifecycle
from outpost_sync._public import PublicMode
from outpost_sync._reads import Reads
from outpost_sync._reservation import Admissions, Reservation
from outpost_sync._tracking import TrackCall, Tracking

_SETTLE_BATCHES = 4
"""Batches whose acknowledged entries settle in one script when they follow each other: fewer,
larger scripts (each identity's state is written once a script), at the cost of entries staying
counted as undelivered a few batches longer."""


class Outpost:
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
        max_customers: the most customers this process follows in memory (about 5 KB each);
            beyond it the least recently read is let go, and Polar told to forget it. A read of
            a customer let go loads it from Redis again (one round trip).
        idle_customer_ttl: seconds without a read after which a customer is let go.
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
        telemetry_to_app: also record into the application's global OpenTelemetry providers.
            Off by default: the records name the meter and the customer (often an email), one
            series each, which an application's pipeline did not ask for.
        durability: ``"primary"`` (default): ``track()`` returns once the primary wrote the
            event. ``"replica"``: it also waits until a replica has it (``WAIT 1``), so a
            fail-over keeps it; when none acknowledges within ``durability_timeout`` seconds it
            raises :class:`NotDurable` (the event is written; a retry with its id is safe).
        mode: ``"auto"`` (the snapshot protocol, or Polar's public API where ``/v1/outpost/``
            answers 404), ``"snapshots"`` or ``"public"``; ``public_margin``, ``poll_interval``
            and ``webhook_secret`` (env ``POLAR_WEBHOOK_SECRET``): see docs/public-mode.md.
        shards: the deployment's shard count (default 16): every instance sharing the Redis
            uses the same. The first instance stores it in Redis; an instance configured with
            another refuses to start (``ConfigurationError``). More shards than 16 spread the
            load over more than 16 Redis Cluster primaries (docs/redis-layout.md).
        record_to: a directory to write conformance traces to (``session.jsonl`` and one
            ``delivery-<n>.jsonl`` per delivery loop): every input of the core and its answers,
            for replay by ``outpost_core.traces``. For debugging and conformance data only.
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
        max_customers: int = 16_000,
        idle_customer_ttl: float = 900.0,
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
        telemetry_to_app: bool = False,
        durability: str = "primary",
        durability_timeout: float = 1.0,
        record_to: str | os.PathLike[str] | None = None,
        logger: logging.Logger | None = None,
        mode: str = "auto",
        public_margin: float = 60.0,
        poll_interval: float = 300.0,
        webhook_secret: str | None = None,
        shards: int = DEFAULT_SHARDS,
    ) -> None:
        require_whole("max_in_flight", max_in_flight, 1, "at least 1")
        # 0 would export to Polar's relay on every drain of the effects
        require_positive("telemetry_interval", telemetry_interval)
        deployment.checked(shards)  # before anything is opened
        # What a forked child starts afresh from (the parameters only: nothing else is bound yet).
        self._arguments: dict[str, Any] = {k: v for k, v in locals().items() if k != "self"}
        tls = tls_context(verify)  # a bundle that cannot be loaded raises here
        durability_policy = Durability.of(durability, durability_timeout)
        self._owns_redis = redis is None
        options = ConnectionOptions.resolve(
            os.environ,
            access_token=access_token,
            redis_url=redis_url,
            server_url=server_url,
            telemetry=telemetry,
            telemetry_url=telemetry_url,
        )
        log = logger or logging.getLogger("outpost")
        for warning in options.cleartext_warnings():  # once, at construction
            log.warning(warning)
        self._context = context = open_context(
            options,
            redis,
            tls=tls,
            ca_bundle=ca_bundle(verify),
            log=log,
            snapshot_timeout=snapshot_timeout,
            max_customers=max_customers,
            idle_customer_ttl=idle_customer_ttl,
            telemetry_interval=telemetry_interval,
            telemetry_to_app=telemetry_to_app,
            clock=clock,
            on_dropped=on_dropped,
            record_to=record_to,
            shards=shards,
        )
        delivery_settings = DeliverySettings(
            batch_size=batch_size,
            linger=linger,
            max_attempts=max_attempts,
            claim_idle=claim_idle,
            backoff_base=retry_base,
            channel_namespace=context.session.settings.channel_namespace,
            shards=context.shards,
            consumer=context.consumer,
            heartbeat=heartbeat,
            requests_per_minute=requests_per_minute,
            batch_bytes=batch_bytes,
            settle_alongside=True,
            settle_every=_SETTLE_BATCHES * batch_size,
            read_alongside=True,
        )
        self._warm = context.session.warm
        self._effects = SessionEffects(context)
        self._delivery = Deliveries(context, self._effects, delivery_settings)
        self._reads = Reads(context, self._effects, self._ensure_started)
        self._tracking = Tracking(context, self._effects, self._reads, durability_policy)
        self._admissions = Admissions(
            context, self._effects, self._reads, durability_policy, self._ensure_started
        )
        secret = webhook_secret or os.environ.get("POLAR_WEBHOOK_SECRET") or None
        self._public = self._reads.public = PublicMode(
            context, self._effects, mode, public_margin, poll_interval, secret, requests_per_minute
        )
        self._lifecycle = Lifecycle(self, context, self._effects, self._delivery, max_in_flight)
        self._lifecycle.public = self._public

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Outpost:
        # Redis may not be up yet: the instance then starts on its next call.
        try:
            self._lifecycle.ensure_started(deferrable=True)
        except BaseException:
            self.close()  # no `with` body, so no exit: nothing is left open
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _ensure_started(self) -> None:
        self._lifecycle.ensure_started()

    def flush(self, timeout: float = 10.0) -> bool:
        """Deliver every event queued when the call started, by any instance.

        Returns ``True`` once each was delivered or dropped (and reported), ``False`` if some
        were still queued after ``timeout`` seconds (they stay queued, nothing is lost).
        """
        self._ensure_started()
        return self._delivery.flush(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Flush, stop the background work and release connections, within ``timeout`` seconds
        whatever is down (what is not delivered stays queued in Redis). Safe to call twice."""
        if not self._context.closed:
            self._lifecycle.close(timeout, self.flush, self._forget_warm, self._owns_redis)

    def _forget_warm(self) -> None:
        self._warm = {}  # the session may still cache a read in flight: none is answered now

    def _after_fork(self) -> None:
        """In a forked child (gunicorn --preload, uWSGI): the parent's threads are gone and its
        locks, sockets and copies are not this process's. Start afresh on the next call, as an
        instance built here would."""
        if self._lifecycle.started and not self._context.closed:
            Outpost.__init__(self, **self._arguments)

    @property
    def delivery_stalled(self) -> str | None:
        """Why delivery to Polar is stalled (a rejected token, a wrong URL), or ``None``."""
        return self._delivery.stalled

    @property
    def connected(self) -> bool:
        """Whether the WebSocket to Polar is open. While it is not, warm reads keep answering
        from memory: the local events keep counting, Polar's totals and credits stay as of the
        last snapshot applied (by any instance sharing the Redis)."""
        return self._context.session.connected

    @property
    def subscribed(self) -> bool:
        """Whether Redis confirmed the subscription to the change channels and it holds: only
        then do warm reads answer from memory (otherwise they read Redis, ``source="redis"``)."""
        return self._context.session.subscribed

    @property
    def status(self) -> Status:
        """What this instance is connected to, and the last error of each connection."""
        ctx = self._context
        with ctx.lock:
            status = ctx.session.status(
                redis_error=ctx.state_outage.error or ctx.subscriber_outage.error,
                delivery_stalled=self.delivery_stalled,
                failed_loop=self._lifecycle.supervisor.failed_loop,
            )
        return attrs.evolve(status, mode=self._public.mode, mode_reason=self._public.reason)

    @property
    def rejections(self) -> dict[str, int]:
        """How many inputs from peers were rejected, by kind (each was logged)."""
        with self._context.lock:
            counts = dict(self._context.session.rejections)
        outbox = self._delivery.rejected_entries
        if outbox:
            counts["outbox_entry"] = outbox
        return counts

    def handle_webhook(
        self, body: bytes, headers: Mapping[str, str] | Mapping[bytes, bytes]
    ) -> int:
        """Take one delivery of Polar's webhooks (raw body, headers) once for every instance
        sharing the Redis; return the HTTP status to answer (204; 503 while no configuration is
        known). Raises :class:`InvalidWebhook` (answer 401) on a bad signature or timestamp."""
        self._ensure_started()
        return self._public.handle_webhook(body, headers)

    # -- track --------------------------------------------------------------------------------

    def track(
        self,
        name: str,
        *,
        external_customer_id: str | None = None,
        customer_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        timestamp: datetime | None = None,
        event_id: str | None = None,
        require_balance: bool = False,
    ) -> str:
        """Record one event; return its id (sent to Polar as ``external_id``).

        When this returns, the event is in Redis: every read, on every instance sharing the
        Redis, counts it, and it will reach Polar or be reported to ``on_dropped``.

        ``require_balance=True`` records it only if every meter it counts in has the available
        balance (``Balance.available``, every instance's holds and events) to cover its value,
        decided atomically in Redis; else :class:`InsufficientBalance`, and nothing is written.

        Raises:
            InvalidEvent: Polar would refuse the event; nothing was written.
            NotReady: no configuration from Polar within ``snapshot_timeout`` (first start).
            RedisUnavailable: Redis did not answer; whether the event was written is unknown
                only if Redis failed after receiving it, and a retry with the same
                ``event_id`` is then safe.
        """
        call = TrackCall(name, external_customer_id, customer_id, metadata, timestamp, event_id)
        if require_balance:
            return self._admissions.track(call, require_balance=True)
        self._ensure_started()
        started = time.perf_counter_ns()
        try:
            return self._tracking.write(call, started)
        except BaseException as exc:
            outcome = track_outcome(exc)
            if outcome is not None and self._context.telemetry.enabled:
                elapsed = time.perf_counter_ns() - started
                self._context.telemetry.recorder.tracked(
                    external_customer_id, customer_id, (), elapsed, outcome
                )
            raise

    def reserve(
        self,
        meter_id: str,
        units: float,
        *,
        external_customer_id: str | None = None,
        customer_id: str | None = None,
        ttl: float = 60.0,
    ) -> Reservation:
        """Hold ``units`` of the meter for the customer, if its available balance (every
        instance's holds and events counted, atomically in Redis) covers them; else raise
        :class:`InsufficientBalance` and hold nothing. Commit the actual usage with
        :meth:`Reservation.commit`; ``with`` releases the hold unless committed. The
        hold expires after ``ttl`` seconds. Only count and sum meters take reservations
        (:class:`UnsupportedMeter` otherwise)."""
        return self._admissions.reserve(meter_id, units, external_customer_id, customer_id, ttl)

    # -- balance ------------------------------------------------------------------------------

    def balance(
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
        if self._context.closed:  # closed, it reads nothing warm either: close() empties _warm
            raise OutpostClosed("this Outpost instance is closed")
        if not self._context.telemetry.enabled:
            return self._reads.when_ready(meter_id, external_customer_id, customer_id, fresh)
        started = time.perf_counter_ns()
        error: BaseException | None = None
        try:
            return self._reads.when_ready(meter_id, external_customer_id, customer_id, fresh)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._context.telemetry.recorder.read(
                (meter_id, external_customer_id, customer_id),
                time.perf_counter_ns() - started,
                read_outcome(error),
            )
