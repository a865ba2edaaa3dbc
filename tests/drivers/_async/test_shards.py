"""The deployment's shard count: the first instance stores it, an instance configured with another
refuses to start and writes nothing, and a deployment of 64 shards tracks, reads and delivers.
Both drivers, real Redis and the emulator."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from outpost_async import AsyncOutpost, ConfigurationError
from outpost_core import SHARDS_KEY, Customer, keys
from outpost_emulator import Emulator
from tests.drivers._async._concurrency import run_concurrently
from tests.drivers._async._helpers import connect, eventually, make, metered
from tests.support.redis_server import RedisServer

C2 = Customer("external", "c2")  # shard 0 of 16, shard 48 of 64


def _outpost_keys(server: RedisServer) -> list[str]:
    client = server.client()
    return sorted(k.decode() for k in client.scan_iter(match=f"{keys.PREFIX}*"))


@pytest.mark.anyio
async def test_the_first_instance_stores_the_default_count(redis_server: RedisServer) -> None:
    async with make(redis_server):
        pass
    assert redis_server.client().get(SHARDS_KEY) == b"16"


@pytest.mark.anyio
async def test_a_deployment_of_64_shards_writes_reads_and_delivers_under_them(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with metered(redis_server, emulator, credits=10, customer="c2", shards=64) as (meter, a):
        assert redis_server.client().get(SHARDS_KEY) == b"64"
        await a.balance(meter, external_customer_id="c2")
        for _ in range(3):
            await a.track("api_call", external_customer_id="c2")
        async with connect(redis_server, emulator, shards=64) as b:

            async def b_sees_them() -> bool:
                return (await b.balance(meter, external_customer_id="c2")).consumed == 3

            await eventually(b_sees_them, what="the other instance reading the three events")
        assert await a.flush(20)
    assert emulator.customer_meter(meter, external_customer_id="c2")["consumed_units"] == 3
    written = _outpost_keys(redis_server)
    mine = [k for k in written if ":external:c2:" in k]
    assert mine and all(k.startswith("outpost:v2:{48}:external:c2:") for k in mine)
    reducer = mine[0].split(":")[5]
    assert keys.state_key(C2, reducer, 64) in written
    assert keys.outbox_key(48) in written


@pytest.mark.anyio
async def test_an_instance_configured_for_another_count_refuses_to_start_and_writes_nothing(
    redis_server: RedisServer,
) -> None:
    async with make(redis_server):
        pass  # the deployment's count: 16
    before = _outpost_keys(redis_server)
    wide = make(redis_server, shards=64)
    try:
        for _ in range(2):  # every call: a refused start leaves nothing running
            with pytest.raises(ConfigurationError) as refused:
                await wide.track("api_call", external_customer_id="c2")
            said = str(refused.value)
            assert "configured for 64 shards" in said and "holds 16 shards" in said
            assert SHARDS_KEY in said
    finally:
        await wide.close()
    assert _outpost_keys(redis_server) == before
    assert redis_server.client().get(SHARDS_KEY) == b"16"


@pytest.mark.anyio
async def test_outbox_streams_without_a_stored_count_were_left_by_16_shards(
    redis_server: RedisServer,
) -> None:
    # What instances that could not choose a count leave: their outbox streams, no count.
    redis_server.client().xgroup_create(keys.outbox_key(3), "outpost", id="0", mkstream=True)
    wide = make(redis_server, shards=64)
    try:
        with pytest.raises(
            ConfigurationError, match=r"configured for 64 shards .* holds 16 shards"
        ):
            await wide.track("api_call", external_customer_id="c2")
    finally:
        await wide.close()
    assert redis_server.client().get(SHARDS_KEY) == b"16"
    async with make(redis_server):  # the default agrees
        pass


@pytest.mark.anyio
async def test_an_unreadable_stored_count_is_refused(redis_server: RedisServer) -> None:
    redis_server.client().set(SHARDS_KEY, "sixteen")
    refused = make(redis_server)
    try:
        with pytest.raises(ConfigurationError, match=r"an unreadable shard count \(sixteen\)"):
            await refused.track("api_call", external_customer_id="c2")
    finally:
        await refused.close()


def test_a_count_out_of_range_is_refused_at_construction(redis_server: RedisServer) -> None:
    with pytest.raises(ConfigurationError, match="shards must be from 1 to 1024, not 0"):
        make(redis_server, shards=0)


@pytest.mark.anyio
async def test_two_first_instances_of_different_counts_at_once_one_starts_the_other_refuses(
    redis_server: RedisServer,
) -> None:
    narrow, wide = make(redis_server), make(redis_server, shards=64)
    outcomes: list[BaseException | None] = []

    def starting(instance: AsyncOutpost) -> Callable[[], Awaitable[None]]:
        async def start() -> None:
            try:
                await instance.__aenter__()
                outcomes.append(None)
            except ConfigurationError as exc:
                outcomes.append(exc)

        return start

    try:
        await run_concurrently([starting(narrow), starting(wide)])
    finally:
        await narrow.close()
        await wide.close()
    stored = redis_server.client().get(SHARDS_KEY)
    assert stored in (b"16", b"64")
    refused = [o for o in outcomes if o is not None]
    assert len(outcomes) == 2 and len(refused) == 1  # the one whose count Redis does not hold
    assert f"holds {stored.decode()} shards" in str(refused[0])
