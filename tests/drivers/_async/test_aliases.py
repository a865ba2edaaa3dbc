"""One customer, two names, both drivers, against the emulator and real Redis:
events tracked under ``customer_id`` on one instance and under ``external_customer_id`` on the
other are counted by every read of either name, which never reads above Polar's balance."""

from __future__ import annotations

import pytest

from outpost_async import AsyncOutpost, Balance
from outpost_emulator import Emulator
from tests.drivers._async._concurrency import run_concurrently
from tests.drivers._async._helpers import connect, count_meter, eventually, metered
from tests.support.redis_server import RedisServer

EXTERNAL = "acme"


async def both_names(instance: AsyncOutpost, meter: str, customer_id: str) -> list[Balance]:
    return [
        await instance.balance(meter, external_customer_id=EXTERNAL),
        await instance.balance(meter, customer_id=customer_id),
    ]


@pytest.mark.anyio
async def test_events_tracked_under_either_name_count_in_reads_of_both(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = count_meter(emulator)
    customer_id = str(emulator.create_customer(external_id=EXTERNAL)["id"])
    emulator.grant_credits(meter, 100, customer_id=customer_id)

    def polar_balance() -> float:
        return float(emulator.customer_meter(meter, customer_id=customer_id)["balance"])

    # Nothing reaches Polar before flush(): until then its balance is 100, after it 95, so every
    # read can be held to it (another instance's copy lagging is tested elsewhere, not here).
    a, b = (connect(redis_server, emulator, linger=60) for _ in range(2))
    async with a, b:
        for instance in (a, b):
            assert [x.balance for x in await both_names(instance, meter, customer_id)] == [100] * 2
        for _ in range(3):
            await a.track("api_call", customer_id=customer_id)
        for _ in range(2):
            await b.track("api_call", external_customer_id=EXTERNAL)

        async def every_read_counts_all_five() -> bool:
            found = [x for i in (a, b) for x in await both_names(i, meter, customer_id)]
            return all(x.consumed == 5 for x in found)

        # Before the fix, a read by one name counted only the events tracked under that name.
        await eventually(every_read_counts_all_five, what="every read counting the 5 events")
        assert polar_balance() == 100
        flushed: list[bool] = []

        async def flush(instance: AsyncOutpost) -> None:
            flushed.append(await instance.flush(10))

        # Both at once: either instance's delivery may hold the other's events, lingering.
        await run_concurrently([lambda: flush(a), lambda: flush(b)])
        assert flushed == [True, True]
        assert polar_balance() == 95
        for instance in (a, b):
            assert [x.balance for x in await both_names(instance, meter, customer_id)] == [95] * 2
            # A read that goes to Redis reads both names' hashes (one round trip).
            fresh = await instance.balance(meter, customer_id=customer_id, fresh=True)
            assert (fresh.source, fresh.balance, fresh.pending) == ("redis", 95, 5)
        seen: list[Balance] = []

        emulator.advance(6 * 60)  # the bucket syncs: Polar pushes snapshots of both names
        seen.clear()

        async def snapshots_cover_every_event() -> bool:
            found = [x for i in (a, b) for x in await both_names(i, meter, customer_id)]
            seen.extend(found)
            return all(x.pending == 0 and x.polar.count == 5 for x in found)

        await eventually(snapshots_cover_every_event, what="snapshots counting the 5 events")
        # Meanwhile some reads over-counted (a name's events the other's newer totals counted):
        # never under, so never above Polar's balance.
        assert all(x.consumed >= 5 and x.balance <= polar_balance() for x in seen)
        for instance in (a, b):
            final = await both_names(instance, meter, customer_id)
            assert [(x.consumed, x.balance) for x in final] == [(5, 95)] * 2
            assert final[0].aliases and final[1].aliases


@pytest.mark.anyio
async def test_a_customer_created_for_a_followed_external_id_is_merged_from_its_push(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with metered(redis_server, emulator) as (meter, a), connect(redis_server, emulator) as b:
        before = await a.balance(meter, external_customer_id="later")
        assert before.aliases == ()
        customer_id = str(emulator.create_customer(external_id="later")["id"])

        async def alias_learned() -> bool:
            found = await a.balance(meter, external_customer_id="later")
            return bool(found.aliases)

        await eventually(alias_learned, what="the pushed snapshot naming the customer id")
        await b.track("api_call", customer_id=customer_id)
        await b.track("api_call", customer_id=customer_id)
        await a.track("api_call", external_customer_id="later")

        async def all_three() -> bool:
            by_external = await a.balance(meter, external_customer_id="later")
            by_id = await b.balance(meter, customer_id=customer_id)
            return by_external.consumed == 3 and by_id.consumed == 3

        await eventually(all_three, what="both reads counting the 3 events")
