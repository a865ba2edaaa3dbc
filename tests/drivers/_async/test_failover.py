"""Fail-over between instances: heartbeats, hand-back on close, removal of dead consumers."""

from __future__ import annotations

from typing import Any

import pytest

from outpost_async import AsyncOutpost
from outpost_core import Customer, _keys
from outpost_core._delivery import GROUP
from outpost_emulator import Emulator
from tests.drivers._async._helpers import connect, count_meter, eventually, holds, make
from tests.drivers._async.test_metering import (
    counters,
    delivered_once,
    killed_before_delivering,
)
from tests.support.redis_server import RedisServer


def consumers(server: RedisServer) -> set[str]:
    """Every consumer of the outbox group, on every shard."""
    client: Any = server.client()
    names: set[str] = set()
    for stream in _keys.all_outboxes():
        if client.exists(stream):
            names |= {c["name"].decode() for c in client.xinfo_consumers(stream, GROUP)}
    return names


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_killed_instance_s_events_are_delivered_within_30_s_with_default_settings(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    killed_before_delivering(redis_server, emulator, 500)
    (dead,) = consumers(redis_server)  # it holds its events, and never posted them
    async with connect(redis_server, emulator) as survivor:
        # Started right after the crash: its heartbeat expires within 10 s, then it is taken.
        assert await survivor.flush(30)
        delivered_once(emulator, 500)
        gone = holds(lambda: dead not in consumers(redis_server))
        await eventually(gone, 10, "the dead consumer left the group")
    assert consumers(redis_server) == set()  # the survivor left too, holding nothing


@pytest.mark.anyio
async def test_a_closing_instance_hands_back_what_it_could_not_deliver(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    count_meter(emulator)
    async with connect(redis_server, emulator) as first:
        await first.track("api_call", external_customer_id="c1")
        assert await first.flush(10)  # the configuration is cached in Redis for the next ones
    wrong = AsyncOutpost(
        access_token="not-a-token",
        server_url=emulator.url,
        redis_url=redis_server.url,
        clock=emulator.clock,
        telemetry=False,
        linger=0.02,
    )
    try:
        for _ in range(20):
            await wrong.track("api_call", external_customer_id="c2")
        stalled = holds(lambda: wrong.delivery_stalled is not None)
        await eventually(stalled, 10, "the instance with a wrong token stalled")
    finally:
        await wrong.close(timeout=0.5)  # it holds them, and Polar refuses its token
    async with connect(redis_server, emulator) as good:
        assert await good.flush(10)  # its first survey finds them handed back
    delivered_once(emulator, 21)
    assert consumers(redis_server) == set()


@pytest.mark.slow
@pytest.mark.anyio
async def test_short_lived_instances_leave_the_outbox_group(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    count_meter(emulator)
    for n in range(100):
        async with connect(redis_server, emulator, requests_per_minute=0) as a:
            await a.track("api_call", external_customer_id=f"c{n}")
    assert counters(emulator)["events"] == 100
    assert consumers(redis_server) == set()


@pytest.mark.anyio
async def test_delivery_and_surveys_go_on_after_redis_loses_its_data(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    count_meter(emulator)
    async with connect(redis_server, emulator, heartbeat=0.4) as a:
        await a.track("api_call", external_customer_id="c1")
        assert await a.flush(10)
        redis_server.client().flushall()  # streams and groups gone: surveys meet "no such key"
        await a.track("api_call", external_customer_id="c1")
        assert await a.flush(10)
    assert counters(emulator)["events"] == 2


@pytest.mark.anyio
async def test_two_idle_loops_re_read_their_pending_entries_after_a_failure_neither_met(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    """The subscription's connection dropped (a Redis failure the delivery loops did not meet):
    they re-read this consumer's pending entries all the same. A loop due to re-read while the
    other one reads does not block in a read of its own, or each would keep the other from it in
    turn until a loop did something else (a beat, the claim check)."""
    meter = count_meter(emulator)
    customer = Customer("external", "c1")
    async with connect(redis_server, emulator) as first:  # caches Polar's configuration in Redis
        await first.balance(meter, external_customer_id=customer.id)
    writer = make(redis_server)  # no token: its event stays in the outbox
    # heartbeat: beats 150 s apart, so none breaks the loops' rhythm.
    a = connect(redis_server, emulator, max_in_flight=2, heartbeat=600.0)
    client: Any = redis_server.client()
    try:
        await writer.track("api_call", external_customer_id=customer.id)
        # Delivered to a's consumer and never settled, as a settlement Redis lost leaves it.
        stream = _keys.outbox_key(_keys.shard_of(customer))
        read = client.xreadgroup(GROUP, a._context.consumer, {stream: ">"})
        assert sum(len(entries) for _, entries in read) == 1
        assert (await a.balance(meter, external_customer_id=customer.id)).consumed == 1

        async def both_reading() -> bool:
            return int(client.info("clients")["blocked_clients"]) == 2

        await eventually(both_reading, 10, "both delivery loops in a blocking read")
        client.client_kill_filter(_type="pubsub")

        async def settled() -> bool:
            return int(client.xpending(stream, GROUP)["pending"]) == 0

        # Not a speed assertion: without the re-read, the entry waits for the claim check (30 s).
        await eventually(settled, 10, "the pending entry re-read and settled")
    finally:
        await a.close()
        await writer.close()
