"""Redis Cluster through a primary's fail-over and a slot migration, both drivers (issue 16).

Each test starts a cluster of its own (three primaries, three replicas, ``cluster-node-timeout``
200 ms): it kills or reshards nodes.
"""

from __future__ import annotations

import time

import pytest
from redis.crc import key_slot

from outpost_async import AsyncOutpost, RedisUnavailable
from outpost_core import Customer
from outpost_core import _keys as keys
from outpost_emulator import Emulator
from tests.drivers._async._helpers import connect, count_meter, eventually
from tests.support.redis_server import RedisCluster


def _slot(customer: Customer) -> int:
    return key_slot(keys.tag_of(customer.shard).encode())


def _customer_elsewhere(cluster: RedisCluster, than: Customer) -> Customer:
    """A customer whose shard another primary owns."""
    port = cluster.port_for_slot(_slot(than))
    for n in range(1000):
        customer = Customer("external", f"spared-{n}")
        if cluster.port_for_slot(_slot(customer)) != port:
            return customer
    raise LookupError("every shard on one primary")


async def _reads(instance: AsyncOutpost, meter: str, customer: Customer) -> tuple[float, str]:
    balance = await instance.balance(meter, external_customer_id=customer.id)
    return balance.consumed, balance.source


async def _polar_counted(emulator: Emulator, meter: str, customer: Customer, at_least: int) -> None:
    async def counted() -> bool:
        row = emulator.customer_meter(meter, external_customer_id=customer.id)
        return float(row["consumed_units"]) >= at_least

    await eventually(counted, 15, f"Polar counting the {at_least} events of {customer}")


@pytest.mark.anyio
async def test_a_killed_primary_fails_over_and_nothing_track_returned_for_is_lost(
    own_redis_cluster: RedisCluster, emulator: Emulator
) -> None:
    cluster = own_redis_cluster
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
            await a.track("api_call", external_customer_id=customer.id)
            returned[customer] += 1

        async def b_follows() -> bool:
            hit_read = await _reads(b, meter, hit)
            return hit_read == (1, "memory") and await _reads(b, meter, spared) == (1, "memory")

        await eventually(b_follows, 10, "b following both customers")
        killed = cluster.port_for_slot(_slot(hit))
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
                if not cluster.node(killed).running and cluster.port_for_slot(_slot(hit)) != killed:
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


@pytest.mark.anyio
async def test_a_migrated_slot_is_followed_and_loses_nothing(
    own_redis_cluster: RedisCluster, emulator: Emulator
) -> None:
    cluster = own_redis_cluster
    meter = count_meter(emulator)
    moved = Customer("external", "moved")
    slot = _slot(moved)
    target = next(p for p in cluster.primary_ports() if p != cluster.port_for_slot(slot))
    async with connect(cluster, emulator) as a, connect(cluster, emulator) as b:
        await a.track("api_call", external_customer_id=moved.id)

        async def b_sees(count: int) -> bool:
            return await _reads(b, meter, moved) == (count, "memory")

        await eventually(lambda: b_sees(1), 10, "b following the customer")
        cluster.begin_migration(slot, target)
        await a.track("api_call", external_customer_id=moved.id)  # keys still on the source
        cluster.move_keys(slot, target)
        await a.track("api_call", external_customer_id=moved.id)  # the source answers ASK
        cluster.end_migration(slot, target)
        await a.track("api_call", external_customer_id=moved.id)  # MOVED, then the target
        await eventually(lambda: b_sees(4), 10, "b following the customer on its new node")
        assert await a.flush(10)
    await _polar_counted(emulator, meter, moved, 4)
