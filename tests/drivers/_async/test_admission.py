"""Exact admission, both drivers, against the emulator and real Redis (one server and a cluster):
reservations hold units every instance sees, refuse what the available balance does not cover,
expire, and commit the actual usage; ``track(require_balance=True)`` admits and records at once."""

from __future__ import annotations

import functools

import pytest

from outpost_async import (
    AsyncOutpost,
    AsyncReservation,
    InsufficientBalance,
    UnsupportedMeter,
    UsageError,
)
from outpost_emulator import Emulator
from tests.drivers._async._concurrency import run_concurrently
from tests.drivers._async._helpers import (
    CALLS_FILTER,
    connect,
    count_meter,
    eventually,
    metered,
    on_redis_and_cluster,
    sum_meter,
)
from tests.support.redis_server import RedisServer

redis_server = on_redis_and_cluster


def polar_consumed(emulator: Emulator, meter: str, customer: str = "c1") -> float:
    return float(emulator.customer_meter(meter, external_customer_id=customer)["consumed_units"])


async def delivered(
    emulator: Emulator, meter: str, consumed: float, *instances: AsyncOutpost
) -> None:
    """Every instance flushes (within 10 s each), then Polar counts ``consumed`` for c1."""
    for instance in instances:
        assert await instance.flush(10)
    assert polar_consumed(emulator, meter) == consumed


async def held_on(instance: AsyncOutpost, meter: str, held: float) -> None:
    async def reads_it() -> bool:
        return (await instance.balance(meter, external_customer_id="c1")).held == held

    await eventually(reads_it, what=f"a warm read seeing {held} held")


@pytest.mark.anyio
async def test_a_hold_is_seen_by_every_instance_and_limits_what_others_admit(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = sum_meter(emulator, credits=10)
    a, b = connect(redis_server, emulator), connect(redis_server, emulator)
    async with a, b:
        reservation = await a.reserve(meter, 4, external_customer_id="c1")
        seen = await a.balance(meter, external_customer_id="c1")
        assert (seen.balance, seen.held, seen.available) == (10, 4, 6)
        await held_on(b, meter, 4)
        with pytest.raises(InsufficientBalance) as refused:
            await b.reserve(meter, 7, external_customer_id="c1")
        assert (refused.value.balance, refused.value.held, refused.value.available) == (10, 4, 6)
        assert refused.value.units == 7
        other = await b.reserve(meter, 6, external_customer_id="c1")
        await held_on(a, meter, 10)
        # The usage was larger than the estimate: recorded as it happened, the hold released.
        await reservation.commit("api_call", metadata={"tokens": 5})
        await other.release()
        await held_on(b, meter, 0)
        after = await b.balance(meter, external_customer_id="c1")
        assert (after.consumed, after.available) == (5, 5)
        await delivered(emulator, meter, 5, a)


@pytest.mark.anyio
async def test_the_block_releases_unless_committed(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with metered(redis_server, emulator, credits=3) as (meter, a):
        with pytest.raises(RuntimeError):
            async with await a.reserve(meter, 2, external_customer_id="c1"):
                raise RuntimeError("the request failed")
        async with await a.reserve(meter, 3, external_customer_id="c1") as r:
            event_id = await r.commit("api_call")
        assert r.committed == event_id
        with pytest.raises(UsageError):
            await r.commit("api_call")
        seen = await a.balance(meter, external_customer_id="c1")
        assert (seen.held, seen.consumed, seen.available) == (0, 1, 2)


@pytest.mark.anyio
async def test_a_hold_expires_and_committing_after_it_still_records(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with metered(redis_server, emulator, credits=2) as (meter, a):
        late = await a.reserve(meter, 2, external_customer_id="c1", ttl=0.3)
        with pytest.raises(InsufficientBalance):
            await a.reserve(meter, 1, external_customer_id="c1")
        # Nobody touches the customer: a read stops counting the hold at its expiry anyway.
        await held_on(a, meter, 0)
        again = await a.reserve(meter, 2, external_customer_id="c1")
        await late.commit("api_call")  # the usage happened: recorded though its hold expired
        seen = await a.balance(meter, external_customer_id="c1")
        assert (seen.consumed, seen.held, seen.available) == (1, 2, -1)
        await again.release()


@pytest.mark.anyio
async def test_track_with_require_balance_admits_exactly(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with metered(redis_server, emulator, credits=10, kind=sum_meter) as (meter, a):
        await a.track(
            "api_call", external_customer_id="c1", metadata={"tokens": 6}, require_balance=True
        )
        with pytest.raises(InsufficientBalance) as refused:
            await a.track(
                "api_call", external_customer_id="c1", metadata={"tokens": 5}, require_balance=True
            )
        assert (refused.value.units, refused.value.available) == (5, 4)
        held = await a.reserve(meter, 3, external_customer_id="c1")
        with pytest.raises(InsufficientBalance):  # the hold counts
            await a.track(
                "api_call", external_customer_id="c1", metadata={"tokens": 2}, require_balance=True
            )
        await held.release()
        await a.track(
            "api_call", external_customer_id="c1", metadata={"tokens": 4}, require_balance=True
        )
        seen = await a.balance(meter, external_customer_id="c1")
        assert (seen.consumed, seen.available) == (10, 0)
        await delivered(emulator, meter, 10, a)


@pytest.mark.anyio
async def test_only_meters_that_add_up_take_reservations(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    largest = emulator.create_meter("largest", CALLS_FILTER, {"func": "max", "property": "tokens"})
    async with connect(redis_server, emulator) as a:
        with pytest.raises(UnsupportedMeter, match="count and sum"):
            await a.reserve(str(largest["id"]), 1, external_customer_id="c1")
        with pytest.raises(UsageError):
            await a.reserve(str(largest["id"]), -1, external_customer_id="c1")


@pytest.mark.anyio
async def test_concurrent_reservations_admit_exactly_the_balance(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = count_meter(emulator, credits=100)
    instances = [connect(redis_server, emulator) for _ in range(2)]
    admitted: list[AsyncReservation] = []
    refused: list[InsufficientBalance] = []

    async def one(instance: AsyncOutpost) -> None:
        try:
            admitted.append(await instance.reserve(meter, 1, external_customer_id="c1"))
        except InsufficientBalance as exc:
            refused.append(exc)

    async with instances[0], instances[1]:
        for instance in instances:
            await instance.balance(meter, external_customer_id="c1")
        await run_concurrently([functools.partial(one, instances[i % 2]) for i in range(160)])
        assert (len(admitted), len(refused)) == (100, 60)

        async def commit(r: AsyncReservation) -> None:
            await r.commit("api_call")

        await run_concurrently([functools.partial(commit, r) for r in admitted])
        await delivered(emulator, meter, 100, *instances)
