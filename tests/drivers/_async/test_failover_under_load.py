"""Fail-overs cost seconds: a Redis Cluster primary killed (several times) under 64 concurrent
``track()`` calls. Every caller gets an event id or ``RedisUnavailable``, nothing else (redis-py's
cluster client, mid fail-over, has raised ``AttributeError`` from connections it closed under
its callers); afterwards ``flush()`` completes within seconds with the default ``claim_idle``
(300 s): a settlement the old primary acknowledged and never replicated is redone at once, by
the delivery loop re-reading its own pending entries. With ``durability="replica"`` no event
``track()`` returned for is lost: Polar counts every one (with ``"primary"`` a fail-over may
lose the last moments' events, which is what that setting allows)."""

from __future__ import annotations

import gc
import time

import pytest
from redis.asyncio.cluster import ClusterNode

from outpost_async import RedisUnavailable
from outpost_async._backend import run_blocking
from outpost_core import Customer
from outpost_emulator import Emulator
from tests.drivers._async._concurrency import run_concurrently
from tests.drivers._async._helpers import connect, count_meter, eventually
from tests.drivers._async._lost_settlement import settlement_lost
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_server import RedisServer

CALLERS = 64
FAIL_OVERS = 3


def _nodes_left_open(cluster: RedisCluster) -> list[str]:
    """The cluster client's nodes for ``cluster`` that still hold an open connection (redis-py's
    async client; the sync one's nodes hold no connections of their own)."""
    found = []
    for node in gc.get_objects():
        # type(), not isinstance(): isinstance asks a lazy proxy (Django's settings) for its
        # __class__, which sets it up, and raises when it is not configured.
        if type(node) is ClusterNode and node.port in cluster.ports:
            connections = getattr(node, "_connections", [])
            if any(connection.is_connected for connection in connections):
                found.append(f"{node.name} ({node.server_type})")
    return found


@pytest.mark.slow
@pytest.mark.anyio
async def test_fail_overs_under_64_tracks_answer_ids_or_redis_unavailable_and_flush_completes(
    cluster: RedisCluster, emulator: Emulator
) -> None:
    meter = count_meter(emulator)
    customers = [Customer("external", f"load-{n}") for n in range(CALLERS)]
    returned = [0] * CALLERS
    refused = [0] * CALLERS
    state = {"done": False}
    # claim_idle: the default 300 s. NotDurable (a RedisUnavailable) while a promoted replica
    # has no replica of its own yet counts as refused.
    async with connect(cluster, emulator, durability="replica") as a:
        await a.track("api_call", external_customer_id=customers[0].id)
        assert await a.flush(30)

        def caller(n: int):  # type: ignore[no-untyped-def]
            async def track_until_done() -> None:
                while not state["done"]:
                    try:
                        await a.track("api_call", external_customer_id=customers[n].id)
                    except RedisUnavailable:
                        refused[n] += 1
                    else:
                        returned[n] += 1
                    # anything else raises out of run_concurrently: the test fails

            return track_until_done

        async def fail_over_several_times() -> None:
            try:
                for round_ in range(FAIL_OVERS):
                    victim = cluster.port_of(customers[round_])
                    before = sum(returned)
                    cluster.kill(victim)

                    async def promoted(victim: int = victim, round_: int = round_) -> bool:
                        try:
                            owner = await run_blocking(cluster.port_of, customers[round_])
                        except Exception:  # the cluster is reconfiguring
                            return False
                        return bool(owner != victim)

                    await eventually(promoted, 30, f"fail-over {round_ + 1}")
                    await run_blocking(cluster.restart, victim)  # back as the new replica
                    await run_blocking(cluster.wait_healthy)

                    async def tracked_again(before: int = before) -> bool:
                        return sum(returned) > before + CALLERS

                    await eventually(tracked_again, 30, "tracks answered after the fail-over")
            finally:
                state["done"] = True

        await run_concurrently([caller(n) for n in range(CALLERS)] + [fail_over_several_times])
        assert sum(refused) > 0, "no caller met a fail-over: the test tested nothing"
        started = time.monotonic()
        # Not a speed assertion: with claim_idle at 300 s, a lost settlement would hold the
        # flush far beyond this deadline.
        assert await a.flush(30), f"flush() still waiting after {time.monotonic() - started} s"
    # A node that left the slot map (a killed primary) may have been connected to again by a
    # call that took it before (its restarted process answers): close() closes those too.
    assert _nodes_left_open(cluster) == []
    delivered = float(
        emulator.customer_meter(meter, external_customer_id=customers[0].id)["consumed_units"]
    )
    assert delivered >= returned[0] + 1


@pytest.mark.anyio
async def test_after_a_redis_failure_a_settlement_redis_lost_is_redone_within_seconds(
    durable_redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = count_meter(emulator)
    # As on the promoted replica after a primary that never replicated the settlement failed.
    async with settlement_lost(durable_redis_server, emulator, meter) as a:
        durable_redis_server.restart()  # a Redis failure every loop meets
        # Not a speed assertion: without the re-read, the entry waits for claim_idle (300 s).
        assert await a.flush(30)
        assert emulator.customer_meter(meter, external_customer_id="c1")["consumed_units"] == 1
