"""What a peer writes (a pub/sub message, a WebSocket frame, the cached configuration, a state
hash) is counted when it is unreadable and never stops the instance: nested brackets that blow
Python's stack, numbers past int()'s 4,300 digits. Both drivers, a real Redis and the emulator."""

from __future__ import annotations

import contextlib
import json

import pytest

from outpost_async import InvalidEvent, NotReady
from outpost_core import Customer
from outpost_core import _keys as keys
from outpost_emulator import Emulator
from tests.drivers._async._helpers import (
    COUNT,
    credited,
    eventually,
    holds,
    make,
    metered,
)
from tests.drivers._async.test_local_state import prepare
from tests.support.redis_server import RedisServer
from tests.support.wiring import shards_of

C1 = Customer("external", "c1")
NESTED = "[" * 100_000


@pytest.mark.anyio
async def test_a_nested_message_on_a_shard_channel_is_counted(redis_server: RedisServer) -> None:
    prepare(redis_server, C1)
    async with make(redis_server) as a:
        assert (await a.balance(COUNT, external_customer_id="c1")).consumed == 0
        await eventually(holds(lambda: a.subscribed), what="the subscription")
        redis_server.client().spublish(keys.channel(keys.shard_of(C1)), NESTED)
        await eventually(holds(lambda: a.rejections.get("change", 0) >= 1), what="a rejection")
        await a.track("api_call", external_customer_id="c1")
        assert (await a.balance(COUNT, external_customer_id="c1")).consumed == 1
        assert a.subscribed  # the subscriber lives on


@pytest.mark.anyio
async def test_a_nested_cached_configuration_is_counted(redis_server: RedisServer) -> None:
    redis_server.client().set(keys.CONFIGURATION_KEY, NESTED)
    async with make(redis_server, snapshot_timeout=0.2) as a:
        with pytest.raises(NotReady):
            await a.track("api_call", external_customer_id="c1")
        assert a.rejections.get("configuration", 0) >= 1


@pytest.mark.anyio
@pytest.mark.parametrize("field", ["n", "rev", "cu", "u"])
async def test_a_state_field_of_five_thousand_digits_is_counted(
    redis_server: RedisServer, field: str
) -> None:
    prepare(redis_server, C1)
    redis_server.client().hset(keys.state_key(C1, "r-count"), field, "9" * 5_000)
    async with make(redis_server, snapshot_timeout=0.2) as a:
        # without a readable cold_until there is no snapshot: a clear error, no ValueError
        with contextlib.suppress(NotReady):
            await a.balance(COUNT, external_customer_id="c1")
        assert a.rejections.get("state", 0) >= 1


@pytest.mark.anyio
async def test_a_nested_websocket_frame_is_counted(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with metered(redis_server, emulator, credits=10, warm=True) as (meter, a):
        emulator.fault_send_frames(["[" * 200_000])
        await eventually(holds(lambda: a.rejections.get("frame", 0) >= 1), what="a rejection")
        emulator.grant_credits(meter, 5, external_customer_id="c1")

        async def pushed() -> bool:
            return await credited(a, meter, "c1") == 15

        await eventually(pushed, what="the WebSocket still working")


BEYOND_JAVASCRIPT = 3 * 10**29  # a bucket boundary, far past 2**53 - 1 and year 9999


@pytest.mark.anyio
@pytest.mark.parametrize(
    "fields",
    [
        {"cold_until": BEYOND_JAVASCRIPT},
        {"as_of": BEYOND_JAVASCRIPT},
        {"reducers": {"r-count": {"count": BEYOND_JAVASCRIPT, "sum": 1, "min": 1, "max": 1}}},
    ],
)
async def test_a_snapshot_with_a_number_past_two_to_the_53_is_counted(
    redis_server: RedisServer, emulator: Emulator, fields: dict[str, object]
) -> None:
    # The TypeScript SDK refuses these (no JavaScript number holds them); Python applied them.
    payload = {"snapshot_id": "s", "external_customer_id": "c1", "as_of": 1, "cold_until": 0}
    payload |= {"reducers": {}, "credited": {}, **fields}
    async with metered(redis_server, emulator, credits=10, warm=True) as (meter, a):
        emulator.fault_send_frames([json.dumps({"type": "snapshot", "payload": payload})])
        await eventually(holds(lambda: a.rejections.get("snapshot", 0) >= 1), what="a rejection")
        emulator.grant_credits(meter, 5, external_customer_id="c1")

        async def pushed() -> bool:
            return await credited(a, meter, "c1") == 15

        await eventually(pushed, what="the WebSocket still working")


@pytest.mark.anyio
@pytest.mark.parametrize(
    "arguments",
    [
        {"metadata": {"k": "v\x00"}},
        {"event_id": "e\ud800"},
        {"metadata": {"_cost": {"amount": 1 / 3, "currency": "usd"}}},
        {"external_customer_id": "c" * 257},
    ],
)
async def test_track_refuses_what_polar_would_refuse(
    redis_server: RedisServer, arguments: dict[str, object]
) -> None:
    prepare(redis_server, C1)
    async with make(redis_server) as a:
        call: dict[str, object] = {"external_customer_id": "c1", **arguments}
        with pytest.raises(InvalidEvent):
            await a.track("api_call", **call)  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize("rev", ["-5", "99999999999999999999", "1.5", "0x10"])
async def test_a_garbage_revision_in_a_state_hash_does_not_freeze_the_copies(
    redis_server: RedisServer, rev: str
) -> None:
    # The scripts went on counting from the garbage (-4, 1e+20, 2.5): revisions no reader
    # takes, so every copy kept the hash as it was and its events never counted.
    prepare(redis_server, C1)
    async with make(redis_server) as a, make(redis_server) as b:
        assert (await a.balance(COUNT, external_customer_id="c1")).consumed == 0
        redis_server.client().hset(keys.state_key(C1, "r-count"), "rev", rev)
        assert (await b.balance(COUNT, external_customer_id="c1")).consumed == 0
        await a.track("api_call", external_customer_id="c1")
        await a.track("api_call", external_customer_id="c1")
        assert (await a.balance(COUNT, external_customer_id="c1")).consumed == 2

        async def b_sees_them() -> bool:
            return (await b.balance(COUNT, external_customer_id="c1")).consumed == 2

        await eventually(b_sees_them, what="the other instance counting both events")


@pytest.mark.anyio
async def test_a_published_change_of_an_unreadable_aggregate_is_counted_and_not_taken(
    redis_server: RedisServer,
) -> None:
    # Taken, the bucket read as absent: its event no longer counted (the balance read above the
    # hash's), and the copy, at the forged revision, ignored the genuine change of that revision.
    prepare(redis_server, C1)
    async with make(redis_server) as a:
        await a.track("api_call", external_customer_id="c1")
        assert (await a.balance(COUNT, external_customer_id="c1")).consumed == 1
        await eventually(holds(lambda: a.subscribed), what="the subscription")
        client = redis_server.client()
        shards = shards_of(redis_server)
        key = keys.state_key(C1, "r-count", shards)
        names = [name.decode() for name in client.hkeys(key)]  # type: ignore[union-attr]
        [bucket] = [name for name in names if name.startswith("a:")]
        forged = {"k": key, "r": int(client.hget(key, "rev") or 0) + 1, "s": [bucket, "x y z"]}
        client.spublish(keys.channel(keys.shard_of(C1, shards)), json.dumps({"c": [forged]}))
        await eventually(holds(lambda: a.rejections.get("change", 0) >= 1), what="a rejection")
        assert (await a.balance(COUNT, external_customer_id="c1")).consumed == 1
        await a.track("api_call", external_customer_id="c1")
        assert (await a.balance(COUNT, external_customer_id="c1")).consumed == 2
        assert a.rejections.get("state", 0) == 0  # the hash itself holds no garbage
