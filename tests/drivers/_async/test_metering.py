"""Metering: every tracked event reaches Polar exactly once, or is reported. Both
drivers, against the emulator and real Redis."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from outpost_async import AsyncOutpost
from outpost_core import _keys
from outpost_emulator import Emulator
from tests.drivers._async._concurrency import run_concurrently
from tests.drivers._async._helpers import (
    connect,
    count_meter,
    eventually,
    holds,
    metered,
    on_redis_and_cluster,
)
from tests.support.redis_server import RedisServer
from tests.support.track_and_hang import track_then_get_killed
from tests.support.wiring import shards_of


class Drops:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.reasons: list[str] = []

    def __call__(self, events: list[dict[str, Any]], reason: str) -> None:
        self.events += events
        self.reasons.append(reason)


def counters(emulator: Emulator) -> dict[str, int]:
    state = emulator.state()
    return {"events": state["events"]["count"], **state["counters"]}


def killed_before_delivering(server: RedisServer, emulator: Emulator, count: int) -> None:
    """An instance in another process tracks ``count`` events, reads them from the outbox (it
    holds them) and is killed before it delivers any."""
    count_meter(emulator)
    tracked = track_then_get_killed(
        server.url, emulator.url, emulator.token, count, shards_of(server)
    )
    assert tracked == count
    assert counters(emulator)["events"] == 0


def delivered_once(emulator: Emulator, count: int) -> None:
    seen = counters(emulator)
    assert (seen["events"], seen["events_duplicate"]) == (count, 0)


redis_server = on_redis_and_cluster


@pytest.mark.anyio
async def test_delivered_events_are_acknowledged(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with metered(redis_server, emulator) as (meter, a):
        await a.balance(meter, external_customer_id="c1")
        for _ in range(50):
            await a.track("api_call", external_customer_id="c1")
        assert await a.flush(10)
        assert counters(emulator)["events"] == 50
        b = await a.balance(meter, external_customer_id="c1")
        assert (b.undelivered, b.consumed) == (0, 50)


@pytest.mark.anyio
async def test_transient_errors_then_success(redis_server: RedisServer, emulator: Emulator) -> None:
    count_meter(emulator)
    emulator.fault_ingest_error(500, count=3)
    drops = Drops()
    async with connect(redis_server, emulator, on_dropped=drops) as a:
        for _ in range(10):
            await a.track("api_call", external_customer_id="c1")
        assert await a.flush(20)
    assert counters(emulator)["events"] == 10
    assert drops.events == []


@pytest.mark.anyio
async def test_exhausted_attempts_report_and_keep_counting(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = count_meter(emulator, credits=10)
    emulator.fault_ingest_error(500, count=1000)
    drops = Drops()
    async with connect(redis_server, emulator, max_attempts=3, on_dropped=drops) as a:
        await a.balance(meter, external_customer_id="c1")
        ids = [await a.track("api_call", external_customer_id="c1") for _ in range(5)]
        assert await a.flush(20)
        assert sorted(e["external_id"] for e in drops.events) == sorted(ids)
        assert all("500" in reason and "3 attempts" in reason for reason in drops.reasons)
        b = await a.balance(meter, external_customer_id="c1")
        # A 500 may come after Polar stored the events: they keep counting (acknowledged, no
        # longer queued) until a snapshot counts them or the pending hour passes.
        assert (b.pending, b.undelivered, b.consumed, b.balance) == (5, 0, 5, 5)
    assert counters(emulator)["events"] == 0


@pytest.mark.anyio
async def test_one_invalid_event_does_not_sink_its_batch(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    count_meter(emulator)
    drops = Drops()
    async with connect(redis_server, emulator, on_dropped=drops, linger=30.0) as a:
        bad = ""
        for n in range(100):
            if n == 42:  # a well-formed id of a customer Polar does not have: 422 at ingest
                bad = await a.track("api_call", customer_id=str(uuid.uuid4()))
            else:
                await a.track("api_call", external_customer_id=f"c{n % 5}")
        assert await a.flush(20)
    assert [e["external_id"] for e in drops.events] == [bad]
    assert "422" in drops.reasons[0]
    assert counters(emulator)["events"] == 99


@pytest.mark.anyio
async def test_a_429_storm_is_respected(redis_server: RedisServer, emulator: Emulator) -> None:
    count_meter(emulator)
    emulator.fault_ingest_error(429, count=3, retry_after=1)
    drops = Drops()
    async with connect(redis_server, emulator, max_attempts=2, on_dropped=drops) as a:
        for _ in range(5):
            await a.track("api_call", external_customer_id="c1")
        assert await a.flush(30)
    seen = counters(emulator)
    assert drops.events == []  # a 429 is a budget, not a failed attempt
    assert seen["events"] == 5
    assert seen["http_ingest"] == 4  # three refusals, one success: no hammering


@pytest.mark.anyio
async def test_a_duplicate_delivery_after_a_lost_response_counts_once(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = count_meter(emulator)
    emulator.fault_ingest_lose_response(count=1)
    # One batch of all five (flush() sends it): on a busy machine, five tracks can outlast the
    # default linger and go as two batches, and only the first would come back as duplicates.
    async with connect(redis_server, emulator, linger=60) as a:
        for _ in range(5):
            await a.track("api_call", external_customer_id="c1")
        assert await a.flush(20)
        assert (await a.balance(meter, external_customer_id="c1")).undelivered == 0
    seen = counters(emulator)
    assert (seen["events"], seen["events_inserted"], seen["events_duplicate"]) == (5, 5, 5)
    assert emulator.customer_meter(meter, external_customer_id="c1")["consumed_units"] == 5


@pytest.mark.anyio
async def test_events_of_a_killed_instance_are_delivered_by_another(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    killed_before_delivering(redis_server, emulator, 1000)
    async with connect(redis_server, emulator, claim_idle=0.5) as survivor:
        assert await survivor.flush(30)
    delivered_once(emulator, 1000)


@pytest.mark.anyio
async def test_delivery_starts_once_redis_comes_up(emulator: Emulator) -> None:
    count_meter(emulator)
    server = RedisServer()  # a port, no server yet: the instance starts while Redis is down
    try:
        async with connect(server, emulator) as a:
            server.start()
            for _ in range(5):
                await a.track("api_call", external_customer_id="c1")
            assert await a.flush(20)
        assert counters(emulator)["events"] == 5
    finally:
        server.close()


@pytest.mark.anyio
async def test_an_unreadable_outbox_entry_is_removed_counted_and_logged(
    redis_server: RedisServer, emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    count_meter(emulator)
    outbox = _keys.all_outboxes(shards_of(redis_server))[3]
    redis_server.client().xadd(outbox, {"e": "not json", "f": "0:x", "k": "[]"})
    with caplog.at_level(logging.WARNING, logger="outpost"):
        async with connect(redis_server, emulator) as a:
            await a.track("api_call", external_customer_id="c1")
            assert await a.flush(20)
            assert a.rejections == {"outbox_entry": 1}
    assert "removed 1 unreadable outbox entries" in caplog.text
    assert redis_server.client().xlen(outbox) == 0
    assert counters(emulator)["events"] == 1


@pytest.mark.anyio
async def test_a_stalled_delivery_is_logged_as_an_error(
    redis_server: RedisServer, emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    count_meter(emulator)
    emulator.fault_ingest_error(401, count=1)
    with caplog.at_level(logging.ERROR, logger="outpost"):
        async with connect(redis_server, emulator) as a:
            await a.track("api_call", external_customer_id="c1")
            stalled = holds(lambda: a.delivery_stalled is not None)
            await eventually(stalled, what="a stalled delivery")
            await a.close(0.1)
    assert "outpost delivery is stalled: Polar answered 401" in caplog.text


@pytest.mark.anyio
async def test_a_waiting_delivery_loop_is_not_woken_by_each_change(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    """A loop that waits (a lingering batch, a backoff, the budget) wakes for a flush, a close,
    another loop's settlement or its own deadline; not at each change its instance applies (in
    the sync driver, a thread woken per track() of any instance, of any customer it follows)."""
    meter = count_meter(emulator)
    async with (
        connect(redis_server, emulator, linger=5.0) as a,
        connect(redis_server, emulator, linger=5.0) as b,
    ):
        await a.track("api_call", external_customer_id="c1")  # a's loops start; it lingers
        await a.balance(meter, external_customer_id="c1")  # a follows c1: it hears b's changes
        machine = a._delivery.machines[0]
        effects = machine.effects
        asked = 0

        def counted() -> Any:
            nonlocal asked
            asked += 1
            return effects()

        machine.effects = counted  # type: ignore[method-assign]
        tracks = 200
        for _ in range(tracks):
            await b.track("api_call", external_customer_id="c1")
        await eventually(lambda: _consumed(a, meter, tracks + 1), 10, "a following b's tracks")
        assert asked < tracks / 4, f"a's delivery loop went round {asked} times for {tracks} tracks"
        # Both at once: a flush waits for every instance's events, and only an instance's own
        # flush wakes its lingering loop (one after the other, the first waited out the linger).
        flushed: list[bool] = []

        async def flush(instance: AsyncOutpost) -> None:
            flushed.append(await instance.flush(10))

        await run_concurrently([lambda: flush(a), lambda: flush(b)])
        assert flushed == [True, True]
    assert counters(emulator)["events"] == tracks + 1


async def _consumed(instance: AsyncOutpost, meter: str, expected: float) -> bool:
    return (await instance.balance(meter, external_customer_id="c1")).consumed == expected
