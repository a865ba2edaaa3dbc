"""What differs on a Redis Cluster: the slot map, one shard subscription per node, and calls
that must reach the node owning a key.

On a cluster the driver sends the same commands, one slot per command (one shard's keys, or one
outbox stream); only the subscriber, the outbox reads and script loading differ
(docs/redis-layout.md, "Redis Cluster"). All three live here.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Callable
from typing import Any

import attrs
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import AskError, MovedError, RedisError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from outpost_async._backend import (
    Worker,
    after_own_echoes,
    close_node_pubsub,
    open_node_pubsub,
    run_on_node,
)
from outpost_async._context import POLL, DriverContext, failed_in_redis
from outpost_async._subscriber import Subscriber
from outpost_core import (
    GROUP,
    ChannelPlacement,
    ChannelsLost,
    ChannelSubscribed,
    Input,
    NodeBroke,
    NodeConfirmed,
    NodeGaveUp,
    OutboxRead,
    PlacementInput,
    ReadOutbox,
    RetireNode,
    SlotMapRead,
    StreamEntry,
    SubscribeOnNode,
    Tick,
    UnsubscribeOnNode,
    stream_entries,
    text_of,
)

_CLUSTER_POLL = 0.01  # seconds: a cluster subscriber looks again this soon after a break
_IDLE_DOUBLINGS = 6  # bounds the doubling (50 ms -> 3.2 s); the read's block (0.5 s) caps it first
_NODE_POLL = 0.05  # seconds a node's worker waits for a message before it looks at its tasks
_TOPOLOGY_CHECK = 1.0  # seconds between two looks at a cluster's slot map
_REDIRECTIONS = 5  # tries of a script on a cluster whose slot map is changing


def owner(cluster: RedisCluster, key: str) -> Any:
    """The node that serves ``key``'s slot, as the client's slot map says."""
    node = cluster.get_node_from_key(key)  # type: ignore[no-untyped-call,unused-ignore]
    if node is None:
        raise RedisConnectionError(f"no node serves {key}")
    return node


async def on_owning_node(
    cluster: RedisCluster, node_calls: Any, key: str, commands: list[tuple[Any, ...]]
) -> list[Any]:
    """``commands`` on one connection of the node that owns ``key``, in one round trip,
    following ASK (with ``ASKING`` on that same connection) and MOVED here: redis-py's async
    cluster client may send ``ASKING`` and the command on two connections, and its pipeline
    may send a redirected call to another node than the command after it."""
    node = owner(cluster, key)
    asking: list[tuple[Any, ...]] = []
    for _ in range(_REDIRECTIONS):
        try:
            async with node_calls:
                replies = await run_on_node(cluster, node, [*asking, *commands])
        except (RedisConnectionError, TimeoutError, OSError):
            await cluster.nodes_manager.initialize()
            node, asking = owner(cluster, key), []
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
            node, asking = owner(cluster, key), []
        else:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return replies
    raise RedisConnectionError(f"the slot of {key} kept moving")


async def read_outboxes_one_by_one(ctx: DriverContext, action: ReadOutbox) -> OutboxRead:
    """A cluster refuses one read across slots: each shard's stream is read on its own (up to
    ``count`` entries each, as one read of every stream gives on one Redis), and an empty round
    waits before the next (no blocking read spans the streams): 50 ms after entries came, twice
    as long after each empty round, up to the read's block (an idle instance read every stream
    20 times a second; a flush's reads block 10 ms at most)."""
    entries: list[StreamEntry] = []
    outboxes = ctx.outboxes
    start = random.randrange(len(outboxes))  # no shard always read first
    for offset in range(len(outboxes)):
        stream = outboxes[(start + offset) % len(outboxes)]
        reply = await ctx.redis.xreadgroup(GROUP, ctx.consumer, {stream: ">"}, count=action.count)
        entries += stream_entries(reply)
    if entries:
        ctx.empty_rounds = 0
    elif action.block > 0:
        version = ctx.deliveries.version
        idle = _CLUSTER_POLL * 5 * 2 ** min(ctx.empty_rounds, _IDLE_DOUBLINGS)
        # A round whose read asked to block less (a flush's) is not idleness.
        ctx.empty_rounds += action.block >= idle
        await ctx.deliveries.wait(version, min(action.block, idle))
    return OutboxRead(entries)


@attrs.define
class NodeSubscription:
    """A cluster node's pub/sub connection, read by a worker of its own, and what its worker has
    yet to (un)subscribe. Which channels it holds is the core's :class:`ChannelPlacement`."""

    pubsub: Any
    to_subscribe: set[str] = attrs.field(factory=set)
    to_unsubscribe: set[str] = attrs.field(factory=set)
    worker: Any = None
    stopped: bool = False
    failure: BaseException | None = None
    """Why its connection broke (the worker stopped); the topology loop then drops it."""


class ClusterSubscriber(Subscriber):
    """One sharded subscription per node, for the channels of the shards it owns now, each read
    by a worker of its own (so a message is taken as soon as it comes, whichever node sends it).
    The core's :class:`ChannelPlacement` decides which node holds which channel, and what the
    session hears of it: a break (its node failed, a slot moved away) loses that node's channels
    only; the session stops their copies following, and reloads them once each channel is
    subscribed again on its owner; the other shards' copies keep following. The topology loop
    (:meth:`run`) reads the slot map after a break and every ``_TOPOLOGY_CHECK`` seconds (a
    subscriber does not follow a fail-over or a migration by itself: docs/redis-layout.md,
    "Redis Cluster"), and runs what the placement asks of the nodes."""

    _placement: ChannelPlacement
    _owners: dict[str, Any]  # the nodes of the last slot map read, by name
    _retired: list[NodeSubscription]  # for the topology loop to stop

    async def run(self) -> None:
        ctx = self._context
        assert ctx.cluster is not None
        nodes = self._nodes = {}
        placement = self._placement = ChannelPlacement(ctx.channels)
        self._owners, self._retired = {}, []
        look_at = 0.0  # when to look at the slot map next
        try:
            while not ctx.closed:
                version = self._look.version
                for name, node in list(nodes.items()):
                    if node.failure is not None and not ctx.closed:  # not what closing broke
                        self._effects.tell(*self._place(NodeBroke(name)))
                        await self._stop_node(nodes.pop(name))
                        ctx.redis_failed(ctx.subscriber_outage, node.failure)
                        look_at = min(look_at, time.monotonic() + _CLUSTER_POLL * 5)
                if time.monotonic() >= look_at:
                    look_at = time.monotonic() + _TOPOLOGY_CHECK
                    try:
                        await self._read_slot_map(ctx.cluster)
                    except (RedisError, OSError) as exc:
                        look_at = time.monotonic() + ctx.redis_failed(ctx.subscriber_outage, exc)
                for node in self._retired:
                    await self._stop_node(node)
                self._retired.clear()
                with ctx.lock:
                    unplaced = placement.unplaced()
                if unplaced:  # a channel given away, or its node broke: find its owner
                    look_at = min(look_at, time.monotonic() + _CLUSTER_POLL * 5)
                effects = self._effects.give(Tick(time.monotonic(), ctx.now_us()))
                if effects:
                    self._effects.hand_over(effects)
                # Until the session's next deadline too: it is ticked here, not at each change.
                wait = min(look_at - time.monotonic(), ctx.until_deadline())
                await self._look.wait(version, max(0.0, wait))
        finally:
            stopping = [*nodes.values(), *self._retired]
            for node in stopping:
                node.stopped = True
            for node in stopping:
                await self._stop_node(node)

    async def _read_slot_map(self, cluster: RedisCluster) -> None:
        """The slot map as the cluster sees it now, to the placement."""
        ctx = self._context
        await cluster.nodes_manager.initialize()
        await ctx.departed_nodes.sweep(cluster, time.monotonic())
        owners = {channel: owner(cluster, channel) for channel in ctx.channels}
        self._owners = {node.name: node for node in owners.values()}
        moves = SlotMapRead({channel: node.name for channel, node in owners.items()})
        self._effects.tell(*self._place(moves))

    def _place(self, event: PlacementInput) -> list[Input]:
        """One input to the placement, under the lock, and what it asks done at once: each
        node's worker is given its (un)subscriptions, a retired node is left for the topology
        loop to stop. Returns what the session is to hear, for the caller to hand it in order
        with the messages around it."""
        ctx = self._context
        for_session: list[Input] = []
        with ctx.lock:
            self._placement.handle(event)
            for effect in self._placement.effects():
                if isinstance(effect, ChannelsLost | ChannelSubscribed):
                    for_session.append(effect)
                else:
                    _PLACEMENT_EFFECTS[type(effect)](self, effect)
        return for_session

    def _subscribe(self, effect: SubscribeOnNode) -> None:
        node = self._nodes.get(effect.node)
        if node is None:
            node = NodeSubscription(open_node_pubsub(self._cluster, self._owners[effect.node]))
            name = f"outpost-subscriber-{effect.node}"
            node.worker = Worker(name, self._node_loop(node, effect.node, name))
            self._nodes[effect.node] = node
        node.to_subscribe.add(effect.channel)
        node.to_unsubscribe.discard(effect.channel)

    def _unsubscribe(self, effect: UnsubscribeOnNode) -> None:
        self._nodes[effect.node].to_unsubscribe |= set(effect.channels)
        self._context.recovery.failed_elsewhere()  # a fail-over no call saw fail

    def _retire(self, effect: RetireNode) -> None:
        node = self._nodes.pop(effect.node)
        node.stopped = True
        self._retired.append(node)

    def _node_loop(self, node: NodeSubscription, address: str, name: str) -> Callable[[], Any]:
        """One node's subscription: (un)subscribe what the placement gave it, then wait for its
        messages. Only this worker touches the node's connection."""
        ctx = self._context

        async def loop() -> None:
            try:
                while not ctx.closed and not node.stopped:
                    with ctx.lock:
                        add, node.to_subscribe = node.to_subscribe, set()
                        remove, node.to_unsubscribe = node.to_unsubscribe, set()
                    if remove:
                        await node.pubsub.sunsubscribe(*sorted(remove))
                    for channel in sorted(add):
                        await node.pubsub.ssubscribe(channel)  # one slot per command
                    await self._take_node_messages(node, address)
            except Exception as exc:  # a Redis error, or redis-py failing under a fail-over
                if not failed_in_redis(exc) and self._supervisor is not None:
                    self._supervisor.failed(name, exc)  # a bug: logged, shown in status
                node.failure = exc
                self._look.fire()

        return loop

    async def _take_node_messages(self, node: NodeSubscription, address: str) -> None:
        """What one node's subscription brought, to the session, as on a single Redis."""
        news, heard = await self.hear(node.pubsub, _NODE_POLL)
        if not news:
            if heard:  # only echoes
                await after_own_echoes()
            return
        reached, effects = self._effects.heard(
            news, functools.partial(self._node_inputs_of, address)
        )
        self.subscriber_back()
        if reached or effects:  # an echo held for a script in flight changed nothing yet
            self._effects.hand_over(effects)

    def _node_inputs_of(self, address: str, message: dict[str, Any]) -> list[Input]:
        """What one node's message means: to the placement first (a confirmation, a channel the
        node gave away), then to the session."""
        kind = text_of(message.get("type"))
        channel = text_of(message.get("channel")) or ""  # no channel: none held
        if kind == "ssubscribe":
            return self._place(NodeConfirmed(address, channel))
        if kind == "sunsubscribe":
            if self._placement.held_by(address, channel):  # not ours: the node gave it away
                self._context.recovery.failed_elsewhere()  # a fail-over no call saw fail
                self._context.deliveries.fire()  # a delivery loop reads its pending again
                self._look.fire()  # the topology loop looks for the channel's new owner
            return self._place(NodeGaveUp(address, (channel,)))
        return self.inputs_of(message)

    async def _stop_node(self, node: NodeSubscription) -> None:
        node.stopped = True
        await node.worker.stop(POLL)
        with contextlib.suppress(RedisError, OSError):
            await close_node_pubsub(node.pubsub)

    @property
    def _cluster(self) -> RedisCluster:
        assert self._context.cluster is not None
        return self._context.cluster


# What each placement effect asks of the cluster subscriber.
# The session's inputs among them (channels lost or subscribed) go back to the caller.
_PLACEMENT_EFFECTS: dict[type, Callable[[ClusterSubscriber, Any], None]] = {
    SubscribeOnNode: ClusterSubscriber._subscribe,
    UnsubscribeOnNode: ClusterSubscriber._unsubscribe,
    RetireNode: ClusterSubscriber._retire,
}
