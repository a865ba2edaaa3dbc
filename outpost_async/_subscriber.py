"""The change subscription on one Redis: every shard's channel on one sharded subscription.

It reads what other instances (and this one) published and hands it to the session; this
instance's own changes (already applied from its scripts' replies) are dropped unparsed. It only
reads and applies: the loads, listings and scripts its news causes go to the effects worker
(``SessionEffects.hand_over``), so the next change never waits behind them. On a
cluster, ``_cluster.py``'s :class:`ClusterSubscriber` reads one subscription per node instead,
with the same hearing (:meth:`Subscriber.hear`).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from outpost_async._backend import (
    Signal,
    after_own_echoes,
    close_pubsub,
    interrupt_pubsub,
    open_pubsub,
    read_pubsub,
    sleep,
)
from outpost_async._context import POLL, DriverContext, log_report
from outpost_core import (
    ChangePublished,
    Input,
    SubscriberLost,
    SubscriptionConfirmed,
    Tick,
    published_data,
)

if TYPE_CHECKING:
    from outpost_async._effects import News, SessionEffects
    from outpost_async._supervisor import Supervisor


class Subscriber:
    """Follow every shard's change channel; after any (re)subscription, the session reloads the
    copies."""

    def __init__(
        self,
        context: DriverContext,
        effects: SessionEffects,
        supervisor: Supervisor | None = None,
    ) -> None:
        self._context = context
        self._effects = effects
        self._own_echo = context.session.own_echo  # asked of every message, without the lock
        self._supervisor = supervisor
        """Told of a cluster node's reader that failed of a bug (the topology loop restarts it)."""
        self._pubsub: Any = None
        self._nodes: dict[str, Any] = {}
        """A cluster's subscriptions, by node (``ClusterSubscriber``)."""
        self._look = Signal()
        """Wakes the cluster's topology loop (``ClusterSubscriber``): a node's subscription
        broke or gave a channel away, or the instance closes. Not the context's signal, which
        fires at every change applied: the loop woke at each (a thread woken per track() in the
        sync driver, the tracking instance's and every instance's following the customer)."""

    def interrupt(self) -> None:
        """The instance closes: end the reads in progress now (on a cluster, each node's), and
        wake the topology loop."""
        nodes = list(self._nodes.values())  # the topology loop may change it meanwhile
        for pubsub in (self._pubsub, *(node.pubsub for node in nodes)):
            if pubsub is not None:
                interrupt_pubsub(pubsub)
        self._look.fire()

    async def run(self) -> None:
        ctx = self._context
        while not ctx.closed:
            pubsub = self._pubsub = open_pubsub(ctx.redis)
            try:
                await pubsub.ssubscribe(*ctx.channels)
                while not ctx.closed:
                    news, heard = await self.hear(pubsub, POLL)
                    if heard and not news:  # only echoes
                        await after_own_echoes()
                        continue
                    self._to_core(news, heard)
            except (RedisError, OSError) as exc:
                if ctx.closed:
                    return  # what closing interrupted
                self._effects.tell(SubscriberLost())
                await sleep(ctx.redis_failed(ctx.subscriber_outage, exc))
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await close_pubsub(pubsub)

    async def hear(self, pubsub: Any, timeout: float) -> tuple[list[News], bool]:
        """What a subscription brought within ``timeout``, and whether anything came: each
        change published that is not an echo the session recognises (``Session.own_echo``,
        asked without the lock), as it came, and redis-py's message of any other reply. Raw
        replies, not redis-py's messages, so that this instance's own changes (already applied
        from the scripts' replies) are dropped before anything is made of them: the echo of
        every track() costs the least it can."""
        own_echo = self._own_echo
        responses = await read_pubsub(pubsub, timeout, self._is_echo)
        news: list[News] = []
        for response in responses:
            change = published_data(response)
            if change is None:  # a subscription's confirmation or end, a health check
                news.append((None, await pubsub.handle_message(response)))
            elif not own_echo(change):
                news.append((change, None))
        return news, bool(responses)

    def _is_echo(self, response: object) -> bool:
        """Whether a raw reply is the echo of this instance's own change (forgotten if so)."""
        change = published_data(response)
        return change is not None and self._own_echo(change)

    def inputs_of(self, message: dict[str, Any]) -> list[Input]:
        """What one message of the subscription means to the session (which decides the rest)."""
        kind = message.get("type")
        if kind in ("smessage", b"smessage"):
            return [ChangePublished(message.get("data"))]
        if kind in ("ssubscribe", b"ssubscribe") and isinstance(message.get("data"), int):
            return [SubscriptionConfirmed(message["data"])]
        return []

    def _to_core(self, news: list[News], heard: bool) -> None:
        """What the subscription heard to the session, then tick it; what the session asks for
        goes to the effects worker."""
        ctx = self._context
        reached, effects = self._effects.heard(news, self.inputs_of)
        # A quiet poll still ticks the session; changes that were all held do not.
        if reached or not heard:
            self.subscriber_back()
            effects += self._effects.give(Tick(time.monotonic(), ctx.now_us()))
        if effects or reached:
            self._effects.hand_over(effects)

    def subscriber_back(self) -> None:
        ctx = self._context
        if ctx.session.subscribed and ctx.subscriber_outage.down:
            log_report(ctx.log, ctx.subscriber_outage.succeeded(time.monotonic()))
