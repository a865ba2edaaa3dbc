"""An idle instance on Redis Cluster reads its outboxes less and less often: a cluster refuses a
blocking read across slots, so each round reads every shard's stream on its own, and an idle
one read all of them 20 times a second for as long as it lived."""

from __future__ import annotations

from typing import Any

import pytest

from outpost_core import Tick
from outpost_emulator import Emulator
from tests.drivers._async._helpers import connect, count_meter, eventually, holds, metered
from tests.support.redis_cluster import RedisCluster


@pytest.mark.anyio
async def test_idle_rounds_wait_longer_each_time_and_entries_start_again_from_50_ms(
    redis_cluster: RedisCluster, emulator: Emulator
) -> None:
    async with metered(redis_cluster, emulator) as (meter, instance):
        await instance.track("api_call", external_customer_id="c1")  # starts the loops
        signal = instance._context.deliveries
        waits: list[float] = []
        wait = signal.wait

        async def recorded(version: int, timeout: float) -> Any:
            waits.append(round(timeout, 3))
            return await wait(version, timeout)

        signal.wait = recorded  # type: ignore[method-assign]
        # 50 ms, then twice as long each empty round, up to the read's block (0.5 s).
        await eventually(holds(lambda: 0.5 in waits), 15, "idle rounds reaching the block")
        assert [w for w in waits if w in (0.05, 0.1, 0.2, 0.4)][:4] == [0.05, 0.1, 0.2, 0.4]
        seen = len(waits)
        await instance.track("api_call", external_customer_id="c2")
        assert await instance.flush(10)
        # The round that found the event starts the idle rounds over.
        await eventually(holds(lambda: 0.05 in waits[seen:]), 15, "an idle round of 50 ms again")
        assert (await instance.balance(meter, external_customer_id="c2")).consumed == 1


@pytest.mark.anyio
async def test_the_topology_loop_does_not_wake_at_every_change(
    redis_cluster: RedisCluster, emulator: Emulator
) -> None:
    """It wakes when a node's subscription breaks or gives a channel away, at the session's
    next deadline and at its slot-map checks; not at each change applied (in the sync driver
    that was a thread woken per track(), the tracking instance's and every follower's)."""
    count_meter(emulator)
    async with connect(redis_cluster, emulator) as instance:
        await instance.track("api_call", external_customer_id="c1")  # subscribed, following
        session = instance._context.session
        handle = session.handle
        ticks = 0

        def counted(event: Any) -> None:  # the topology loop ticks the session once a round
            nonlocal ticks
            ticks += isinstance(event, Tick)
            handle(event)

        session.handle = counted  # type: ignore[method-assign]
        tracks = 200
        for _ in range(tracks):
            await instance.track("api_call", external_customer_id="c1")
        assert ticks < tracks / 4, f"{ticks} rounds of the topology loop for {tracks} tracks"
