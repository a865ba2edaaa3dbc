"""Redis Cluster through a primary's fail-over and a slot migration, both drivers.

Each test starts a cluster of its own (three primaries and 16 shards, then four and 64; a replica
each, ``cluster-node-timeout`` 200 ms): it kills or reshards nodes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import redis
from redis.crc import key_slot

from outpost_async import AsyncOutpost, NotDurable, RedisUnavailable
from outpost_core import Customer
from outpost_core import _keys as keys
from outpost_emulator import Emulator
from tests.drivers._async._helpers import connect, count_meter, eventually
from tests.drivers._async._lost_settlement import settlement_lost
from tests.support.redis_cluster import RedisCluster


def _customer_elsewhere(cluster: RedisCluster, than: Customer) -> Customer:
    """A customer whose shard another primary owns."""
    port = cluster.port_of(than)
    for n in range(1000):
        customer = Customer("external", f"spared-{n}")
        if cluster.port_of(customer) != port:
            return customer
    raise LookupError("every shard on one primary")


async def _reads(instance: AsyncOutpost, meter: str, customer: Customer) -> tuple[float, str]:
    balance = await instance.balance(meter, external_customer_id=customer.id)
    return balance.consumed, balance.source


async def _follows(instance: AsyncOutpost, meter: str, customer: Customer, count: int) -> None:
    """Wait until ``instance`` answers ``count`` for ``customer`` from memory (its copy follows)."""

    async def sees() -> bool:
        return await _reads(instance, meter, customer) == (count, "memory")

    await eventually(sees, 10, f"{customer} followed with {count} events")


async def _track_durably(instance: AsyncOutpost, customer: Customer) -> None:
    """``track()`` until a replica holds the event. A replica on a busy machine misses a short
    ``durability_timeout`` now and then (``NotDurable``): the retry, with the error's event id,
    writes nothing twice and waits for the replica again."""
    deadline = time.monotonic() + 30
    event_id = None
    while True:
        try:
            await instance.track("api_call", external_customer_id=customer.id, event_id=event_id)
            return
        except NotDurable as error:
            assert time.monotonic() < deadline, f"no replica acknowledged within 30 s: {error}"
            event_id = error.event_id


async def _polar_counted(emulator: Emulator, meter: str, customer: Customer, at_least: int) -> None:
    async def counted() -> bool:
        row = emulator.customer_meter(meter, external_customer_id=customer.id)
        return float(row["consumed_units"]) >= at_least

    await eventually(counted, 15, f"Polar counting the {at_least} events of {customer}")


@pytest.mark.anyio
async def test_a_killed_primary_fails_over_and_nothing_track_returned_for_is_lost(
    cluster: RedisCluster, emulator: Emulator
) -> None:
    meter = count_meter(emulator)
    hit = Customer("external", "hit")
    spared = _customer_elsewhere(cluster, hit)
    returned = {hit: 0, spared: 0}
    # A settlement the dead primary acknowledged but never replicated leaves its entry pending on
    # the promoted replica: it is delivered again (Polar counts it once) after claim_idle.
    options = {"durability": "replica", "durability_timeout": 0.5, "claim_idle": 1.0}
    claim = {"claim_idle": 1.0}
    async with connect(cluster, emulator, **options) as a, connect(cluster, emulator, **claim) as b:
        for customer in (hit, spared):
            await _track_durably(a, customer)
            returned[customer] += 1

        async def b_follows() -> bool:
            hit_read = await _reads(b, meter, hit)
            return hit_read == (1, "memory") and await _reads(b, meter, spared) == (1, "memory")

        await eventually(b_follows, 10, "b following both customers")
        killed = cluster.port_of(hit)
        cluster.kill(killed)
        # The hit shard's events are refused (its primary is gone, then its promoted replica
        # has no replica of its own) until the killed node is back as that replica, and every
        # shard's while the cluster is down; the spared shard's copies keep following all along
        # (b's reads answer from memory).
        deadline = time.monotonic() + 30
        written_after_kill = 0
        attempted = returned[spared]
        while written_after_kill < 3:
            assert time.monotonic() < deadline, "no fail-over within 30 s"
            try:
                await a.track("api_call", external_customer_id=hit.id)
                returned[hit] += 1
                written_after_kill += 1
            except RedisUnavailable:  # NotDurable too: the event may be written, not returned
                if not cluster.node(killed).running and cluster.port_of(hit) != killed:
                    cluster.restart(killed)  # it rejoins as the promoted replica's replica
            attempted += 1
            try:  # refused too while the cluster is down (it requires full coverage)
                await a.track("api_call", external_customer_id=spared.id)
                returned[spared] += 1
            except RedisUnavailable:
                pass
            consumed, source = await _reads(b, meter, spared)
            assert source == "memory" and consumed <= attempted

        async def b_reloaded() -> bool:
            memory = await _reads(b, meter, hit)
            fresh = await b.balance(meter, external_customer_id=hit.id, fresh=True)
            return memory == (fresh.consumed, "memory") and fresh.consumed >= returned[hit]

        await eventually(b_reloaded, 15, "b's copy of the hit shard reloaded and following")
        assert b.subscribed
        assert await a.flush(15)  # delivery resumed on the promoted replica
    await _polar_counted(emulator, meter, hit, returned[hit])
    await _polar_counted(emulator, meter, spared, returned[spared])


MOVED = Customer("external", "moved")


@asynccontextmanager
async def _tracking_moved(
    cluster: RedisCluster, emulator: Emulator
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Instance a tracks events of ``MOVED`` on a count meter, instance b follows them: one is
    tracked and followed; yields a's ``track`` for more. On exit b has followed every event
    tracked, a has flushed them, and Polar counts them all."""
    meter = count_meter(emulator)
    tracked = 0
    async with connect(cluster, emulator) as a, connect(cluster, emulator) as b:

        async def track() -> None:
            nonlocal tracked
            await a.track("api_call", external_customer_id=MOVED.id)
            tracked += 1

        await track()
        await _follows(b, meter, MOVED, 1)
        yield track
        await _follows(b, meter, MOVED, tracked)
        assert await a.flush(10)
    await _polar_counted(emulator, meter, MOVED, tracked)


@pytest.mark.anyio
async def test_a_migrated_slot_is_followed_and_loses_nothing(
    cluster: RedisCluster, emulator: Emulator
) -> None:
    slot = cluster.slot_of(MOVED)
    target = next(p for p in cluster.primary_ports() if p != cluster.port_for_slot(slot))
    async with _tracking_moved(cluster, emulator) as track:
        cluster.begin_migration(slot, target)
        await track()  # keys still on the source
        cluster.move_keys(slot, target)
        await track()  # the source answers ASK
        cluster.end_migration(slot, target)
        await track()  # MOVED, then the target


def _subscribers_on(node: redis.Redis) -> list[str]:
    """The connections of ``node`` whose last command (un)subscribed a shard."""
    clients = node.client_list()
    return [c["addr"] for c in clients if c["cmd"] in ("ssubscribe", "sunsubscribe")]


@pytest.mark.anyio
async def test_a_primary_that_gave_every_shard_away_is_let_go_and_copies_follow(
    cluster: RedisCluster, emulator: Emulator
) -> None:
    source = cluster.port_of(MOVED)
    target = next(p for p in cluster.primary_ports() if p != source)
    node = cluster.node_client(source)
    slots = {key_slot(c.encode()) for c in keys.all_channels("", cluster.shards)}
    leaving = sorted(slot for slot in slots if cluster.port_for_slot(slot) == source)
    async with _tracking_moved(cluster, emulator) as track:
        assert _subscribers_on(node)  # a's and b's
        for slot in leaving:
            cluster.migrate_slot(slot, target)

        async def let_go() -> bool:
            return not _subscribers_on(node)

        await eventually(let_go, 10, "both instances closing their subscriptions to the source")
        await track()


@pytest.mark.anyio
async def test_after_a_fail_over_no_call_saw_fail_a_lost_settlement_is_redone_within_seconds(
    cluster: RedisCluster, emulator: Emulator
) -> None:
    """A primary replaced while alive (it stalled past ``cluster-node-timeout``, or an operator's
    ``CLUSTER FAILOVER``) fails no call: redis-py follows the ``MOVED`` its old node answers.
    A settlement it acknowledged and never replicated is lost all the same, which leaves the
    entry pending for this instance's consumer on the new primary: the moved shard has the
    delivery loops re-read their own pending entries, as a Redis failure does."""
    meter = count_meter(emulator)
    async with settlement_lost(cluster, emulator, meter, "c1") as a:
        cluster.fail_over(cluster.port_of(Customer("external", "c1")))
        # Not a speed assertion: without the re-read, the entry waits for claim_idle (300 s).
        assert await a.flush(30)
        counted = emulator.customer_meter(meter, external_customer_id="c1")
        assert counted["consumed_units"] == 1
