# GENERATED from outpost_async/_lifecycle.py by scripts/unasync.py: do not edit.
"""Starting an instance's background work on its first call, and stopping it at close.

Every loop runs under the supervisor (``_supervisor.py``). A start that fails leaves nothing
running, so the next call starts the instance again from scratch."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from outpost_core import Closing, OutpostClosed, RedisUnavailable, SubscriberLost
from outpost_io.telemetry import LAST_EXPORT
from outpost_sync._backend import (
    CallLimit,
    Worker,
    close_at_exit,
    forget_at_exit,
    release_node_connections,
    start_afresh_after_fork,
)
from outpost_sync._cluster import ClusterSubscriber
from outpost_sync._context import DriverContext
from outpost_sync._delivery import Deliveries
from outpost_sync._effects import SessionEffects
from outpost_sync._public import PublicMode
from outpost_sync._shards import agree_on_shards
from outpost_sync._subscriber import Subscriber
from outpost_sync._supervisor import Supervisor
from outpost_sync._telemetry import sync_counts, telemetry_forever
from outpost_sync._websocket import LinkLoop

_CLOSE_RESERVE = 1.0  # seconds of close()'s timeout kept for what comes after its flush


class Lifecycle:
    """The instance's workers: started once, by the first call that needs them."""

    def __init__(
        self,
        owner: Any,
        context: DriverContext,
        effects: SessionEffects,
        delivery: Deliveries,
        max_in_flight: int,
    ) -> None:
        self._owner = owner  # the public client: what exit and fork hooks act on
        self._context = context
        self._effects = effects
        self._delivery = delivery
        self._max_in_flight = max_in_flight
        self.public: PublicMode | None = None  # the client sets it
        self.supervisor = Supervisor(context)
        self.workers: list[Worker] = []
        self.started = False
        self._subscriber: Subscriber | None = None
        self._starting = CallLimit(1)
        self._exit_hook: Callable[[], None] | None = None

    def ensure_started(self, *, deferrable: bool = False) -> None:
        """Start the instance unless it runs. Before anything else it agrees with Redis on the
        deployment's shard count (``ConfigurationError`` when Redis holds another); while Redis
        cannot answer that, the call raises ``RedisUnavailable``, or, ``deferrable`` (entering the
        instance's context), returns and leaves the start to the next call."""
        ctx = self._context
        if self.started and not ctx.closed:
            return  # every call passes here: no lock once started
        if ctx.closed:
            raise OutpostClosed("this Outpost instance is closed")
        with self._starting:  # the others wait: none writes before the count is agreed
            if self.started:
                return
            try:
                agree_on_shards(ctx)
            except RedisUnavailable:
                if not deferrable:
                    raise
                return  # logged as an outage: the next call starts it
            with ctx.lock:
                self.started = True
            try:
                self._start()
            except BaseException:
                # No half-started instance: the next call starts it again (nothing runs yet).
                forget_at_exit(self._exit_hook)
                self._exit_hook = None
                if ctx.http is not None:
                    http, ctx.http = ctx.http, None
                    http.close()
                self.started = False
                raise

    def _start(self) -> None:
        ctx = self._context
        public = self.public
        assert public is not None
        public.before_start()  # the mode asked for: before the link wants a socket
        # The session's clock starts now: deadlines set before a first tick would be past.
        self._effects.tick()
        self._effects.read_cached_configuration()
        if ctx.access_token:
            self._delivery.open_client()  # first: what can fail (a proxy's missing package)
        self._exit_hook = close_at_exit(self._owner)
        start_afresh_after_fork(self._owner)
        supervise = self.supervisor.worker
        subscribing = ClusterSubscriber if ctx.cluster else Subscriber
        subscriber = self._subscriber = subscribing(ctx, self._effects, self.supervisor)
        self.workers.append(supervise("outpost-subscriber", subscriber.run, self._lost_changes))
        self.workers.append(supervise("outpost-effects", self._effects.run_handed_over))
        if ctx.telemetry.enabled:
            self.workers.append(supervise("outpost-telemetry", lambda: telemetry_forever(ctx)))
        if not ctx.access_token:
            ctx.log.warning(
                "outpost has no access token: events stay queued in Redis until an instance "
                "with a token delivers them"
            )
            return
        if public.mode != "public":
            link = LinkLoop(ctx, self._effects)
            self.workers.append(supervise("outpost-websocket", link.run, link.failed))
        if public.mode != "snapshots":  # public, or auto until Polar's answer
            self.workers.append(supervise("outpost-public", public.run))
        self.workers += self._delivery.start(self._max_in_flight, self.supervisor)

    def _lost_changes(self) -> None:
        """The subscriber failed: what was published meanwhile is lost, so the copies stop
        answering from memory (reads go to Redis) until it subscribes again and reloads them."""
        self._effects.feed(SubscriberLost())

    def close(
        self,
        timeout: float,
        flush: Callable[[float], bool],
        forget_warm: Callable[[], None],
        owns_redis: bool,
    ) -> None:
        """The instance's close(): flush (unless delivery is known to be stalled), stop the
        workers and release connections, within ``timeout`` seconds whatever is down."""
        ctx = self._context
        deadline = time.monotonic() + timeout
        forget_at_exit(self._exit_hook)  # the exit hook has nothing left to do
        ctx.telemetry.quiet()  # an exporter failing from here on is one DEBUG line at the end
        try:
            blocked = self._delivery.blocked
            if blocked is not None:
                # Polar refuses what only an operator fixes: a flush could only wait it out.
                ctx.log.warning(
                    "outpost closes without flushing (delivery is stalled: %s); the queued "
                    "events stay in Redis for the next instance",
                    blocked,
                )
            elif self.started and self._delivery.machines:
                # Flushing until the end: the loops' reads block only briefly, so they notice
                # the close at once rather than at the end of a long read after the flush.
                ctx.flushing += 1
                # What comes after the flush (workers, the last telemetry export) keeps a reserve.
                with contextlib.suppress(RedisUnavailable, RedisError, OSError):
                    flush(timeout - min(_CLOSE_RESERVE, timeout / 2))
            self._effects.feed(Closing())  # a close frame to Polar while the socket is open
        finally:
            ctx.closed = True
            forget_warm()
            ctx.signal.fire()
            ctx.deliveries.fire()
            self._effects.wake()
            if self._subscriber is not None:
                self._subscriber.interrupt()
            self.stop(deadline)
        if ctx.http is not None:
            ctx.http.close()
        ctx.batches.close()
        if ctx.cluster is not None:
            ctx.departed_nodes.close(ctx.cluster)
            release_node_connections(ctx.cluster)
        if owns_redis:
            ctx.redis.close()
        ctx.traces.close()

    def stop(self, deadline: float) -> None:
        """Stop every worker, hand this instance's outbox entries back, export telemetry one last
        time: all by ``deadline`` (monotonic)."""
        ctx = self._context
        for worker in self.workers:
            worker.stop(deadline - time.monotonic())
        self.workers.clear()
        if self._delivery.machines:
            self._delivery.hand_back()
        bound = min(LAST_EXPORT, deadline - time.monotonic())
        with ctx.lock:
            warm = ctx.session.warm_reads()
        ctx.telemetry.shutdown(time.monotonic(), *sync_counts(ctx.session), warm, bound=bound)
