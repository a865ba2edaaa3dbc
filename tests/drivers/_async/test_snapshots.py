"""Snapshots over the WebSocket, the first read, and reconnection, both drivers,
against the emulator and real Redis."""

from __future__ import annotations

import sys

import attrs
import pytest

from outpost_async import AsyncOutpost, NotReady
from outpost_async._backend import sleep
from outpost_core import BUCKET_US, floor_bucket, from_us, to_us
from outpost_core._remote import STEP_TIMEOUT
from outpost_emulator import Emulator
from tests.drivers._async._concurrency import run_concurrently
from tests.drivers._async._helpers import (
    connect,
    credited,
    eventually,
    holds,
    metered,
    on_redis_and_cluster,
    sum_meter,
    until_credited,
)
from tests.support.redis_server import RedisServer

redis_server = on_redis_and_cluster


@pytest.mark.anyio
async def test_first_read_waits_for_the_snapshot_then_reads_from_memory(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with metered(redis_server, emulator, credits=100) as (meter, a):
        first = await a.balance(meter, external_customer_id="c1")
        assert (first.credited, first.consumed, first.balance) == (100, 0, 100)
        assert first.cold_until is not None and first.snapshot_as_of is not None
        stats = redis_server.client().info("commandstats")
        loads = stats.get("cmdstat_hgetall", {}).get("calls", 0)
        for _ in range(100):
            again = await a.balance(meter, external_customer_id="c1")
            assert again is first  # the warm path hands back the computed balance
        stats = redis_server.client().info("commandstats")
        assert stats.get("cmdstat_hgetall", {}).get("calls", 0) == loads
        assert a.connected


@pytest.mark.anyio
async def test_a_late_snapshot_raises_not_ready_then_arrives(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with metered(redis_server, emulator, snapshot_timeout=0.3) as (meter, a):
        await eventually(holds(lambda: a.connected), what="the WebSocket opening")
        emulator.fault_snapshot_delay(1.0)
        with pytest.raises(NotReady, match="no snapshot from Polar"):
            await a.balance(meter, external_customer_id="c1")

        async def arrived() -> bool:
            try:
                await a.balance(meter, external_customer_id="c1")
            except NotReady:
                return False
            return True

        await eventually(arrived, what="the delayed snapshot arriving")


@pytest.mark.anyio
async def test_a_snapshot_replaces_the_local_buckets_it_covers(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with metered(redis_server, emulator, credits=1000, kind=sum_meter) as (meter, a):
        for tokens in (3, 4, 5):
            await a.track("api_call", external_customer_id="c1", metadata={"tokens": tokens})
        local = await a.balance(meter, external_customer_id="c1")
        assert (local.consumed, local.local.count, local.polar.count) == (12, 3, 0)
        assert await a.flush(10)
        emulator.advance(6 * 60)  # the bucket closes and syncs; Polar pushes a snapshot

        async def replaced() -> bool:
            b = await a.balance(meter, external_customer_id="c1")
            return b.polar.count == 3 and b.local.count == 0 and b.pending == 0

        await eventually(replaced, what="the pushed snapshot replacing the bucket")
        b = await a.balance(meter, external_customer_id="c1")
        assert (b.consumed, b.balance, b.polar.sum) == (12, 988, 12)


@pytest.mark.anyio
async def test_a_pending_cold_event_stays_counted_until_a_snapshot_counts_it(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    emulator.fault_ingest_error(503, count=10_000)  # Polar takes no event for now
    async with metered(redis_server, emulator, credits=100, max_attempts=1000) as (meter, a):
        await a.balance(meter, external_customer_id="c1")
        await a.track("api_call", external_customer_id="c1")
        await a.track("api_call", external_customer_id="c1")
        tracked_bucket = floor_bucket(to_us(emulator.clock.now()))
        emulator.advance(6 * 60)
        emulator.grant_credits(meter, 1, external_customer_id="c1")  # pushes a snapshot

        async def cold() -> bool:
            b = await a.balance(meter, external_customer_id="c1")
            return (
                b.credited == 101
                and b.cold_until is not None
                and (to_us(b.cold_until) > tracked_bucket)
            )

        await eventually(cold, what="a snapshot that makes the events' bucket cold")
        b = await a.balance(meter, external_customer_id="c1")
        assert (b.consumed, b.pending, b.polar.count) == (2, 2, 0)
        emulator.fault_clear()

        async def counted() -> bool:
            b = await a.balance(meter, external_customer_id="c1")
            return b.polar.count == 2 and b.pending == 0

        await eventually(counted, what="Polar counting the late events")
        b = await a.balance(meter, external_customer_id="c1")
        assert (b.consumed, b.balance) == (2, 99)
        assert BUCKET_US == 300_000_000


@pytest.mark.anyio
async def test_late_events_a_pushed_snapshot_left_hot_are_counted_by_asking_again(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    """Events for a bucket that just ended, held back by Polar's paused syncs: when they land,
    Polar pushes a snapshot, but its close-sync of that bucket has not run yet, so the snapshot
    leaves them pending; nothing of the customer's moves after that, so Polar pushes nothing
    more. The instance asks again once its wait is over, and the events stop being pending."""
    async with metered(redis_server, emulator, credits=100) as (meter, a):
        session = a._context.session
        with a._context.lock:  # a second's wait, not ten minutes (the session's clock is real)
            session.settings = attrs.evolve(session.settings, refresh_after=1.0)
        first = await a.balance(meter, external_customer_id="c1")
        end = floor_bucket(to_us(emulator.clock.now())) + BUCKET_US
        emulator.set_time(from_us(end + 500_000))  # half a second into the next bucket
        emulator.freeze()
        emulator.fault_pause_syncs()
        for _ in range(5):
            await a.track("api_call", external_customer_id="c1", timestamp=from_us(end - 10**7))
        assert await a.flush(10)
        emulator.fault_resume_syncs()  # Polar counts them and pushes a snapshot

        async def pushed() -> bool:
            b = await a.balance(meter, external_customer_id="c1")
            return b.snapshot_id != first.snapshot_id

        await eventually(pushed, what="the snapshot pushed when Polar counted the events")
        b = await a.balance(meter, external_customer_id="c1")
        assert b.cold_until is not None and to_us(b.cold_until) == end - BUCKET_US
        assert (b.consumed, b.pending, b.polar.count) == (5, 5, 0)
        emulator.advance(6 * 60)  # Polar has synced that bucket since; nothing else moves

        async def counted() -> bool:
            b = await a.balance(meter, external_customer_id="c1")
            return b.pending == 0 and b.polar.count == 5

        await eventually(counted, what="the snapshot the instance asked for")
        b = await a.balance(meter, external_customer_id="c1")
        assert (b.consumed, b.balance) == (5, 95)


@pytest.mark.anyio
async def test_a_credit_grant_reaches_every_instance(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with (
        metered(redis_server, emulator, credits=100, warm=True) as (meter, a),
        connect(redis_server, emulator) as b,
    ):
        assert await credited(b, meter, "c1") == 100
        emulator.grant_credits(meter, 50, external_customer_id="c1")

        await until_credited(meter, "c1", 150, a, b, what="the grant reaching both instances")
        emulator.grant_credits(meter, -200, external_customer_id="c1")

        await until_credited(
            meter, "c1", 0, a, b, what="the revocation (credits never go below zero)"
        )


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["close", "abort"])
async def test_reconnects_and_asks_again_after_the_websockets_drop(
    redis_server: RedisServer, emulator: Emulator, mode: str
) -> None:
    async with metered(redis_server, emulator, credits=10) as (meter, a):
        await check_reconnection(a, emulator, meter, mode)


async def check_reconnection(
    instance: AsyncOutpost, emulator: Emulator, meter: str, mode: str
) -> None:
    """With c1 credited 10: the WebSockets drop (``mode``), a new connection asks for c1 again,
    and Polar's next push arrives on it. The TLS suite checks the same over ``wss://``."""
    assert await credited(instance, meter, "c1") == 10
    emulator.fault_drop_websockets(mode)

    async def subscribed_again() -> bool:
        connections = emulator.state()["connections"]
        return instance.connected and any(c.get("subscriptions") for c in connections)

    await eventually(subscribed_again, what="a new connection asking for c1 again")
    emulator.grant_credits(meter, 5, external_customer_id="c1")

    await until_credited(meter, "c1", 15, instance, what="a push on the new connection")


@pytest.mark.anyio
async def test_two_instances_converge_to_polars_customer_meters(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = sum_meter(emulator)
    customers = ["c1", "c2", "c3"]
    for customer in customers:
        emulator.grant_credits(meter, 1000, external_customer_id=customer)
    async with connect(redis_server, emulator) as a, connect(redis_server, emulator) as b:
        for round_ in range(3):
            for n, customer in enumerate(customers):
                instance = a if (n + round_) % 2 else b
                await instance.track(
                    "api_call", external_customer_id=customer, metadata={"tokens": n + round_}
                )
            emulator.advance(4 * 60)
        assert await a.flush(10) and await b.flush(10)
        emulator.advance(15 * 60)  # past the syncs and the seals

        async def converged() -> bool:
            for customer in customers:
                polar = emulator.customer_meter(meter, external_customer_id=customer)
                for instance in (a, b):
                    mine = await instance.balance(meter, external_customer_id=customer)
                    if mine.pending or mine.balance != polar["balance"]:
                        return False
            return True

        await eventually(converged, what="both instances matching Polar's customer meters")


@pytest.mark.anyio
async def test_malformed_and_unexpected_frames_are_counted_and_survived(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with metered(redis_server, emulator, credits=10, warm=True) as (meter, a):
        junk: list[str | bytes] = [
            "not json",
            "[1, 2]",
            '{"type": 5}',
            '{"type": "mystery", "payload": {}}',
            '{"type": "snapshot", "payload": {"snapshot_id": "x"}}',
            '{"type": "snapshot", "payload": {"snapshot_id": "x", "external_customer_id": "c1",'
            ' "as_of": 1, "cold_until": 7, "reducers": {}, "credited": {}}}',
            '{"type": "counted", "payload": {"request_id": "nobody", "event_ids": []}}',
            '{"type": "error", "payload": {"code": "boom", "message": "from the test"}}',
            b"\x00\x01 binary",
        ]
        emulator.fault_send_frames(junk)

        await eventually(
            holds(lambda: sum(a.rejections.values()) >= len(junk)),
            what="every bad frame counted as a rejection",
        )
        assert a.connected
        assert sum(a.rejections.values()) == len(junk)
        emulator.grant_credits(meter, 5, external_customer_id="c1")

        await until_credited(meter, "c1", 15, a, what="snapshots still applied after the junk")


@pytest.mark.anyio
async def test_a_reader_racing_pushed_snapshots_never_leaves_a_flow_hanging(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    """A read drains the core's effects; those queued by another thread (a flow's next step)
    must still run, or the customer's flow waits for good (it hung so in 3
    runs of 6 once)."""
    async with metered(redis_server, emulator, credits=1000) as (meter, a):
        await a.balance(meter, external_customer_id="c1")
        done: list[bool] = []

        async def reader() -> None:
            while not done:
                await a.balance(meter, external_customer_id="c1")
                await sleep(0)

        async def pusher() -> None:
            try:
                for round_ in range(1, 151):
                    await a.track("api_call", external_customer_id="c1")
                    emulator.grant_credits(meter, 1, external_customer_id="c1")  # a push

                    async def seen(expected: float = 1000 + round_) -> bool:
                        return await credited(a, meter, "c1") == expected

                    # Well under the core's step deadline, which would hide a lost effect.
                    await eventually(seen, timeout=STEP_TIMEOUT / 2, what=f"push {round_}")
            finally:
                done.append(True)

        # Threads (the sync twin) switch far more often than by default, to make the race likely.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-5)
        try:
            await run_concurrently([reader, reader, reader, pusher])
        finally:
            sys.setswitchinterval(interval)
