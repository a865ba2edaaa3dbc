"""Reads that are never stale: a copy answers from memory only while it follows Redis;
otherwise, and with ``fresh=True``, a read costs one Redis round trip and says so."""

from __future__ import annotations

import uuid

import pytest

from outpost_async import AsyncOutpost
from outpost_core import Customer
from outpost_core import _keys as keys
from tests.drivers._async._helpers import COUNT, eventually, make
from tests.drivers._async.test_local_state import consumed, prepare
from tests.support.redis_server import RedisServer


async def barrier(server: RedisServer, instance: AsyncOutpost, customer: Customer) -> None:
    """Return once ``instance``'s subscriber has taken a message published on the customer's
    channel after this call started: every change published before it has reached the copy.
    The marker is unreadable on purpose, so the instance counts it as a rejected change."""
    client = server.client()
    channel = keys.channel(keys.shard_of(customer))
    before = instance.rejections.get("change", 0)
    try:

        async def marker_taken() -> bool:
            if instance.rejections.get("change", 0) > before:
                return True
            client.spublish(channel, "barrier")  # again: it may be missed
            return False

        await eventually(marker_taken, what="the subscriber taking a marker message")
    finally:
        client.close()


@pytest.mark.anyio
async def test_a_first_read_never_serves_a_copy_that_misses_a_later_track(
    redis_server: RedisServer,
) -> None:
    """Each fresh instance's first read, then at once a track on another instance: once the
    change had time to arrive over pub/sub, the reader counts it."""
    async with make(redis_server) as a:
        for _ in range(10):
            customer = Customer("external", f"c-{uuid.uuid4().hex[:8]}")
            prepare(redis_server, customer)
            async with make(redis_server) as b:
                first = await b.balance(COUNT, external_customer_id=customer.id)
                assert first.consumed == 0
                # From memory only once following: subscribed, and loaded after that.
                assert first.source == "redis" or b.subscribed
                await a.track("api_call", external_customer_id=customer.id)
                await barrier(redis_server, b, customer)
                assert await consumed(b, COUNT, customer.id) == 1


@pytest.mark.anyio
async def test_two_hundred_first_touch_customers_are_never_read_stale(
    redis_server: RedisServer,
) -> None:
    async with make(redis_server) as a, make(redis_server) as b:
        for _ in range(200):
            customer = Customer("external", f"c-{uuid.uuid4().hex[:8]}")
            prepare(redis_server, customer)
            assert await consumed(b, COUNT, customer.id) == 0
            await a.track("api_call", external_customer_id=customer.id)
            await barrier(redis_server, b, customer)
            found = await b.balance(COUNT, external_customer_id=customer.id)
            assert (found.consumed, found.source) == (1, "memory")


@pytest.mark.anyio
async def test_fresh_reads_redis_even_when_the_copy_missed_a_change(
    redis_server: RedisServer,
) -> None:
    customer = Customer("external", "c1")
    prepare(redis_server, customer)
    async with make(redis_server) as b:
        warm = await b.balance(COUNT, external_customer_id="c1")
        assert (warm.consumed, warm.source) == (0, "memory")
        # A write that bypasses the channel: the copy cannot know of it.
        raw = redis_server.client()
        state = keys.state_key(customer, "r-count")
        raw.hset(state, "a:0", "5 5 1 1")
        raw.hincrby(state, "rev", 1)
        raw.close()
        assert await consumed(b, COUNT, "c1") == 0  # memory: as documented, behind Redis
        fresh = await b.balance(COUNT, external_customer_id="c1", fresh=True)
        assert (fresh.consumed, fresh.source) == (5, "redis")
        # The copy took the newer state from the fresh read.
        assert await consumed(b, COUNT, "c1") == 5


@pytest.mark.anyio
async def test_a_killed_subscriber_connection_never_serves_a_stale_read_from_redis(
    redis_server: RedisServer,
) -> None:
    """Reads while the subscription is re-established come from Redis (and are exact); once it
    is back and the copies reloaded, from memory again."""
    customer = Customer("external", "c1")
    prepare(redis_server, customer)
    async with make(redis_server) as a, make(redis_server) as b:
        assert await consumed(b, COUNT, "c1") == 0
        await eventually(_subscribed(b), what="b subscribed")
        raw = redis_server.client()
        assert raw.client_kill_filter(_type="pubsub") >= 2
        raw.close()
        sources: set[str] = set()
        for tracked in range(1, 101):
            await a.track("api_call", external_customer_id="c1")
            found = await b.balance(COUNT, external_customer_id="c1")
            sources.add(found.source)
            if found.source == "redis":
                assert found.consumed == tracked

        async def b_follows_again() -> bool:
            found = await b.balance(COUNT, external_customer_id="c1")
            return b.subscribed and found.source == "memory" and found.consumed == 100

        await eventually(b_follows_again, what="b following again, exact, from memory")


def _subscribed(instance: AsyncOutpost):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return instance.subscribed

    return check
