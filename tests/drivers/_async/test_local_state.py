"""Local state: track() and balance() over real Redis, for both drivers."""

from __future__ import annotations

from typing import cast

import pytest

from outpost_async import (
    AsyncOutpost,
    InvalidEvent,
    NotReady,
    UnknownMeter,
    UnsupportedMeter,
    UsageError,
)
from outpost_core import SHARDS_KEY, Aggregate, Customer
from outpost_core import _keys as keys
from tests.drivers._async._concurrency import run_concurrently
from tests.drivers._async._helpers import (
    CONFIGURATION,
    COUNT,
    LARGEST,
    TOKENS,
    UNIQUE,
    eventually,
    holds,
    make,
    now_us,
    on_redis_and_cluster,
)
from tests.support import polar
from tests.support.redis_server import RedisServer
from tests.support.wiring import shards_of

Entries = list[tuple[bytes, dict[bytes, bytes]]]
CREDITS = {COUNT: 100.0, TOKENS: 1000.0, LARGEST: 50.0, UNIQUE: 0.0}


def prepare(server: RedisServer, *customers: Customer) -> None:
    """Polar's side, until the WebSocket brings it: configuration plus an empty snapshot."""
    client = server.client()
    client.set(SHARDS_KEY, shards_of(server))  # as the deployment's first instance did
    polar.store_configuration(client, CONFIGURATION)
    now = now_us()
    for customer in customers:
        polar.apply_snapshot(
            client,
            customer,
            cold_until=polar.bucket_of(now),
            as_of=now,
            now=now,
            totals={r["id"]: Aggregate() for r in CONFIGURATION["reducers"]},
            credited=CREDITS,
            shards=shards_of(server),
        )
    client.close()


async def consumed(instance: AsyncOutpost, meter: str, customer: str) -> float:
    return (await instance.balance(meter, external_customer_id=customer)).consumed


redis_server = on_redis_and_cluster


@pytest.mark.anyio
async def test_two_instances_see_each_others_events(redis_server: RedisServer) -> None:
    prepare(redis_server, Customer("external", "c1"))
    async with make(redis_server) as a, make(redis_server) as b:
        assert await consumed(b, COUNT, "c1") == 0
        for i in range(5):
            await a.track("api_call", external_customer_id="c1", metadata={"tokens": i})
        mine = await a.balance(COUNT, external_customer_id="c1")
        assert (mine.consumed, mine.balance, mine.pending) == (5, 95, 5)

        async def b_sees_them() -> bool:
            return await consumed(b, COUNT, "c1") == 5 and await consumed(b, TOKENS, "c1") == 10

        await eventually(b_sees_them, what="instance b seeing a's events")
        await b.track("api_call", external_customer_id="c1", metadata={"tokens": 7})

        async def a_sees_b() -> bool:
            return await consumed(a, LARGEST, "c1") == 7 and await consumed(a, COUNT, "c1") == 6

        await eventually(a_sees_b, what="instance a seeing b's event")


@pytest.mark.anyio
async def test_an_instance_drops_the_echo_of_its_own_change(redis_server: RedisServer) -> None:
    prepare(redis_server, Customer("external", "c1"))
    async with make(redis_server) as a:
        for meter in (COUNT, TOKENS, LARGEST):  # followed: track() replies with what it publishes
            await consumed(a, meter, "c1")
        for _ in range(5):  # an echo may come before its reply, or after it: either is dropped
            await a.track("api_call", external_customer_id="c1", metadata={"tokens": 1})

        async def dropped() -> bool:
            return len(a._context.session._echoes) == 0  # each expected echo came, and went

        await eventually(dropped, what="the echoes of its own changes recognised")
        assert await consumed(a, COUNT, "c1") == 5


@pytest.mark.anyio
async def test_an_instance_tracking_without_pause_still_hears_the_others(
    redis_server: RedisServer,
) -> None:
    """A busy instance's own echoes come one after the other (the sync driver's subscriber rests
    a moment after a read of only those): another instance's changes still reach its copies."""
    prepare(redis_server, Customer("external", "busy"), Customer("external", "watched"))
    async with make(redis_server) as a, make(redis_server) as b:
        await consumed(a, COUNT, "busy")
        assert await consumed(a, COUNT, "watched") == 0
        done = False
        tracked = 0

        async def track_flat_out() -> None:
            nonlocal tracked
            while not done:
                await a.track("api_call", external_customer_id="busy")
                tracked += 1

        async def others_heard() -> None:
            nonlocal done
            try:
                # Once the busy instance's subscriber has heard nothing but its echoes a while.
                await eventually(holds(lambda: tracked >= 200), what="a tracking flat out")
                for _ in range(5):
                    await b.track("api_call", external_customer_id="watched")

                async def from_memory() -> bool:
                    read = await a.balance(COUNT, external_customer_id="watched")
                    return read.consumed == 5 and read.source == "memory"

                await eventually(from_memory, what="the busy instance hearing b's events")
            finally:
                done = True

        await run_concurrently([track_flat_out, others_heard])
        assert await consumed(a, COUNT, "busy") > 0


@pytest.mark.anyio
async def test_events_the_filter_refuses_do_not_count(redis_server: RedisServer) -> None:
    prepare(redis_server, Customer("external", "c1"))
    async with make(redis_server) as a:
        await a.track("other_call", external_customer_id="c1", metadata={"tokens": 3})
        assert await consumed(a, COUNT, "c1") == 0
        assert await consumed(a, TOKENS, "c1") == 3


@pytest.mark.anyio
async def test_a_missed_message_reloads_the_copy(redis_server: RedisServer) -> None:
    customer = Customer("external", "c1")
    prepare(redis_server, customer)
    async with make(redis_server) as a, make(redis_server) as b:
        assert await consumed(b, COUNT, "c1") == 0
        # A write that bypasses the channel, as if b had missed its message.
        state = keys.state_key(customer, "r-count", shards_of(redis_server))
        raw = redis_server.client()
        raw.hset(state, "a:0", "40 40 1 1")
        raw.hincrby(state, "rev", 1)
        await a.track("api_call", external_customer_id="c1")

        async def b_reloaded() -> bool:
            return await consumed(b, COUNT, "c1") == 41

        await eventually(b_reloaded, what="instance b reloading after a revision gap")


@pytest.mark.anyio
async def test_a_killed_subscriber_connection_ends_in_a_correct_copy(
    redis_server: RedisServer,
) -> None:
    prepare(redis_server, Customer("external", "c1"))
    async with make(redis_server) as a, make(redis_server) as b:
        assert await consumed(b, COUNT, "c1") == 0
        await eventually(holds(lambda: a.subscribed), what="a subscribed")
        await eventually(holds(lambda: b.subscribed), what="b subscribed")
        raw = redis_server.client()
        killed = raw.client_kill_filter(_type="pubsub")
        assert killed >= 2
        for _ in range(20):
            await a.track("api_call", external_customer_id="c1")

        async def both_right() -> bool:
            return await consumed(a, COUNT, "c1") == 20 and await consumed(b, COUNT, "c1") == 20

        await eventually(both_right, what="both copies converging after the kill")
        await eventually(holds(lambda: b.subscribed), what="b subscribed again")


@pytest.mark.anyio
async def test_a_restarted_redis_ends_in_a_correct_copy(
    durable_redis_server: RedisServer,
) -> None:
    server = durable_redis_server
    prepare(server, Customer("external", "c1"))
    async with make(server) as a, make(server) as b:
        for _ in range(3):
            await a.track("api_call", external_customer_id="c1")

        async def b_has_three() -> bool:
            return await consumed(b, COUNT, "c1") == 3

        await eventually(b_has_three)
        server.restart()
        # Written while b's subscription is still re-establishing: b must not miss it.
        raw = server.client()
        for _ in range(10):
            try:
                await a.track("api_call", external_customer_id="c1")
            except Exception:
                continue  # Redis may refuse while the connection pool recovers
        total = int(
            raw.hget(keys.state_key(Customer("external", "c1"), "r-count", shards_of(server)), "n")
            or 0
        )
        assert total >= 3

        async def b_matches_redis() -> bool:
            now = int(
                raw.hget(
                    keys.state_key(Customer("external", "c1"), "r-count", shards_of(server)), "n"
                )
                or 0
            )
            return await consumed(b, COUNT, "c1") == now and await consumed(a, COUNT, "c1") == now

        await eventually(b_matches_redis, what="copies matching Redis after its restart")


@pytest.mark.anyio
async def test_awkward_external_ids_round_trip_and_never_collide(
    redis_server: RedisServer,
) -> None:
    ids = [
        "a:b",
        "a",
        "b",
        "{a}",
        "a}{",
        "a b",
        "a%20b",
        "a%3Ab",
        "ünïcödé ✓ 客户",
        "tab\there",
        "new\nline",
        "x" * 255,
        "x" * 256,  # the longest external id track() takes
    ]
    customers = [Customer("external", i) for i in ids]
    prepare(redis_server, *customers)
    shards = shards_of(redis_server)
    assert len({keys.state_key(c, "r-count", shards) for c in customers}) == len(ids)
    async with make(redis_server) as a, make(redis_server) as b:
        for n, external in enumerate(ids, start=1):
            for _ in range(n):
                await a.track("api_call", external_customer_id=external)
        for n, external in enumerate(ids, start=1):
            assert await consumed(a, COUNT, external) == n

            async def b_agrees(external: str = external, n: int = n) -> bool:
                return await consumed(b, COUNT, external) == n

            await eventually(b_agrees, what=f"b reading {external[:20]!r}")
    raw = redis_server.client()
    entries = [cast(Entries, raw.xrange(key)) for key in keys.all_outboxes(shards)]
    outbox = b"".join(fields[b"e"] for listing in entries for _, fields in listing).decode()
    for external in ids:
        assert external.replace("\n", "\\n").replace("\t", "\\t") in outbox


@pytest.mark.anyio
async def test_concurrent_tracking_loses_no_increment(redis_server: RedisServer) -> None:
    prepare(redis_server, Customer("external", "c1"))
    from tests.drivers._async._concurrency import run_concurrently

    async with make(redis_server) as a, make(redis_server) as b:

        async def worker() -> None:
            for _ in range(100):
                await a.track("api_call", external_customer_id="c1", metadata={"tokens": 2})
                await b.track("api_call", external_customer_id="c1", metadata={"tokens": 1})

        await run_concurrently([worker] * 8)

        async def all_counted() -> bool:
            return all(
                [
                    await consumed(a, COUNT, "c1") == 1600,
                    await consumed(b, COUNT, "c1") == 1600,
                    await consumed(a, TOKENS, "c1") == 2400,
                    await consumed(b, TOKENS, "c1") == 2400,
                ]
            )

        await eventually(all_counted, what="1600 concurrent events on both instances")
        assert (await a.balance(COUNT, external_customer_id="c1")).pending == 1600


@pytest.mark.anyio
async def test_more_callers_at_once_than_redis_py_allows_connections_all_succeed(
    redis_server: RedisServer,
) -> None:
    """300 callers tracking at once, past redis-py's pools of 100 connections (the client's, a
    cluster node's): each call waits for a connection (threads, a cluster's calls) or goes in a
    pipeline (tasks) instead of failing."""
    prepare(redis_server, Customer("external", "c1"))
    from tests.drivers._async._concurrency import run_concurrently

    async with make(redis_server) as outpost:
        assert await consumed(outpost, COUNT, "c1") == 0

        async def worker() -> None:
            for _ in range(20):  # long enough for all 300 to be at it at once
                await outpost.track("api_call", external_customer_id="c1")

        await run_concurrently([worker] * 300)
        assert await consumed(outpost, COUNT, "c1") == 6000


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"name": "", "external_customer_id": "c1"}, "name"),
        ({"name": 12, "external_customer_id": "c1"}, "name"),
        ({"name": "x" * 129, "external_customer_id": "c1"}, "128"),
        ({"name": "api_call"}, "exactly one"),
        ({"name": "api_call", "external_customer_id": "c1", "customer_id": "c2"}, "exactly one"),
        ({"name": "api_call", "customer_id": "not-a-uuid"}, "UUID"),
        ({"name": "api_call", "external_customer_id": ""}, "non-empty"),
        ({"name": "api_call", "external_customer_id": "c1", "metadata": {"x": object()}}, "x"),
        ({"name": "api_call", "external_customer_id": "c1", "metadata": {"x": [1]}}, "x"),
        ({"name": "e", "external_customer_id": "c1", "metadata": {"x": float("nan")}}, "finite"),
        ({"name": "e", "external_customer_id": "c1", "metadata": {"x": -float("inf")}}, "finite"),
        ({"name": "api_call", "external_customer_id": "c1", "metadata": "tokens=3"}, "mapping"),
        ({"name": "api_call", "external_customer_id": "c1", "metadata": {"x": ""}}, "500"),
        ({"name": "api_call", "external_customer_id": "c1", "metadata": {1: 2}}, "keys"),
    ],
)  # fmt: skip
async def test_bad_input_raises_before_anything_is_written(
    redis_server: RedisServer, arguments: dict[str, object], message: str
) -> None:
    prepare(redis_server, Customer("external", "c1"))
    raw = redis_server.client()
    before = sorted(raw.keys("*"))
    async with make(redis_server) as a:
        with pytest.raises(InvalidEvent, match=message):
            await a.track(**arguments)  # type: ignore[arg-type]
    assert sorted(raw.keys("*")) == before


@pytest.mark.anyio
async def test_a_redis_that_forgot_the_scripts_is_given_them_again(
    redis_server: RedisServer,
) -> None:
    prepare(redis_server, Customer("external", "c1"))
    raw = redis_server.client()
    async with make(redis_server) as a:
        await a.track("api_call", external_customer_id="c1")
        raw.script_flush()  # as after a restart without persistence: EVALSHA answers NOSCRIPT
        await a.track("api_call", external_customer_id="c1")
        assert (await a.balance(COUNT, external_customer_id="c1", fresh=True)).pending == 2


@pytest.mark.anyio
async def test_unhashable_read_arguments_get_a_clear_error(redis_server: RedisServer) -> None:
    # The warm path looks arguments up before it checks them: what it cannot hash is still
    # refused with the SDK's own error, not a TypeError from a dict.
    prepare(redis_server, Customer("external", "c1"))
    async with make(redis_server) as a:
        await a.balance(COUNT, external_customer_id="c1")  # warm: a cache to look in
        with pytest.raises(InvalidEvent, match="external_customer_id"):
            await a.balance(COUNT, external_customer_id=["c1"])  # type: ignore[arg-type]
        with pytest.raises(InvalidEvent, match="customer_id"):
            await a.balance(COUNT, external_customer_id="c1", customer_id={})  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="meter_id"):
            await a.balance([COUNT], external_customer_id="c1")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_read_without_snapshot_raises_not_ready(redis_server: RedisServer) -> None:
    prepare(redis_server)
    async with make(redis_server, snapshot_timeout=0.2) as a:
        # On a busy machine the load from Redis alone can outlast a short timeout (NotReady then
        # names the load): ask again until the load is done, then it names the snapshot.
        async def names_the_snapshot() -> bool:
            with pytest.raises(NotReady) as raised:
                await a.balance(COUNT, external_customer_id="nobody")
            return "no snapshot" in str(raised.value)

        await eventually(names_the_snapshot, what="NotReady naming the missing snapshot")


@pytest.mark.anyio
async def test_meters_that_cannot_be_read_locally_say_so(redis_server: RedisServer) -> None:
    prepare(redis_server, Customer("external", "c1"))
    async with make(redis_server) as a:
        with pytest.raises(UnknownMeter):
            await a.balance("no-such-meter", external_customer_id="c1")
        with pytest.raises(UnsupportedMeter, match="unique"):
            await a.balance(UNIQUE, external_customer_id="c1")


@pytest.mark.anyio
async def test_track_without_any_configuration_raises_not_ready(
    redis_server: RedisServer,
) -> None:
    async with make(redis_server, snapshot_timeout=0.2) as a:
        with pytest.raises(NotReady, match="configuration"):
            await a.track("api_call", external_customer_id="c1")
    # Nothing but the deployment's shard count, which the start stored.
    assert list(redis_server.client().scan_iter("*")) == [SHARDS_KEY.encode()]


@pytest.mark.anyio
async def test_a_snapshot_replaces_buckets_and_keeps_uncounted_events(
    redis_server: RedisServer,
) -> None:
    customer = Customer("external", "c1")
    prepare(redis_server, customer)
    async with make(redis_server) as a, make(redis_server) as b:
        first = await a.track("api_call", external_customer_id="c1", metadata={"tokens": 5})
        await a.track("api_call", external_customer_id="c1", metadata={"tokens": 7})
        now = now_us()
        # Polar synced the bucket and counted the first event only.
        polar.apply_snapshot(
            redis_server.client(),
            customer,
            cold_until=polar.bucket_of(now) + 300_000_000,
            as_of=now + 1,
            now=now + 1,
            totals={
                "r-count": Aggregate.of([1.0, 1.0, 1.0]),  # two older events plus the first
                "r-tokens": Aggregate.of([5.0, 3.0, 3.0]),
                "r-largest": Aggregate.of([5.0, 3.0, 3.0]),
            },
            credited={COUNT: 10.0, TOKENS: 20.0, LARGEST: 5.0},
            counted={"r-count": [first], "r-tokens": [first], "r-largest": [first]},
            shards=shards_of(redis_server),
        )

        async def applied() -> bool:
            got = await b.balance(COUNT, external_customer_id="c1")
            return got.cold_until is not None and got.credited == 10.0

        await eventually(applied, what="b seeing the snapshot")
        for instance in (a, b):
            count = await instance.balance(COUNT, external_customer_id="c1")
            assert (count.consumed, count.balance, count.pending) == (4, 6, 1)
            assert await consumed(instance, TOKENS, "c1") == 18
            assert await consumed(instance, LARGEST, "c1") == 7


@pytest.mark.anyio
async def test_closed_instances_refuse_calls(redis_server: RedisServer) -> None:
    from outpost_async import OutpostClosed

    prepare(redis_server, Customer("external", "c1"))
    a = make(redis_server)
    await a.balance(COUNT, external_customer_id="c1")
    await a.close()
    await a.close()
    with pytest.raises(OutpostClosed):
        await a.balance(COUNT, external_customer_id="c1")
    with pytest.raises(OutpostClosed):
        await a.track("api_call", external_customer_id="c1")
    # The customer is warm: a reservation would need no read, and is refused all the same.
    with pytest.raises(OutpostClosed):
        await a.reserve(COUNT, 1, external_customer_id="c1")
    with pytest.raises(OutpostClosed):
        await a.track("api_call", external_customer_id="c1", require_balance=True)
    with pytest.raises(OutpostClosed):
        await a.flush()
