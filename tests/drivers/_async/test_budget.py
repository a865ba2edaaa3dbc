"""One request budget for every instance of an organization (Polar's rate limit is
per organization, whatever the token), against the emulator's limit."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from outpost_async import AsyncOutpost
from outpost_emulator import Emulator
from tests.drivers._async._concurrency import run_concurrently
from tests.drivers._async._helpers import connect, count_meter
from tests.drivers._async.test_metering import counters
from tests.support.redis_server import RedisServer

LIMIT = 60  # the emulator's requests a minute
SHARE = 56  # the instances' budget: a full bucket (3) and a minute of refill stay under LIMIT


@pytest.fixture
def limited() -> Iterator[Emulator]:
    with Emulator.start(port=0, sync_delay=1.0, rate_limit=LIMIT) as emu:
        yield emu


@pytest.mark.anyio
async def test_busy_instances_share_one_budget_and_get_no_429(
    redis_server: RedisServer, limited: Emulator
) -> None:
    count_meter(limited)
    instances = [
        connect(redis_server, limited, requests_per_minute=SHARE, batch_size=10) for _ in range(3)
    ]
    try:

        def busy(outpost: AsyncOutpost) -> Callable[[], Awaitable[None]]:
            async def track() -> None:
                for i in range(300):
                    await outpost.track("api_call", external_customer_id=f"c{i % 5}")

            return track

        await run_concurrently([busy(outpost) for outpost in instances])
        for outpost in instances:
            assert await outpost.flush(60)
    finally:
        for outpost in instances:
            await outpost.close()
    seen = counters(limited)
    assert (seen["events"], seen["events_duplicate"]) == (900, 0)
    # Without a shared budget, 900 events in batches of 10 are some 90 requests: 429s.
    assert seen.get("http_rate_limited", 0) == 0
    assert seen["http_ingest"] < LIMIT


@pytest.mark.anyio
async def test_an_event_too_large_for_any_request_is_dropped_and_reported(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = count_meter(emulator)
    dropped: list[tuple[list[dict[str, Any]], str]] = []
    async with connect(
        redis_server,
        emulator,
        batch_bytes=4096,
        on_dropped=lambda events, reason: dropped.append((events, reason)),
    ) as a:
        padding = {f"pad{n}": "x" * 400 for n in range(15)}  # 6 kB: Polar caps each string
        await a.track("api_call", external_customer_id="c1", metadata=padding)
        await a.track("api_call", external_customer_id="c1")
        assert await a.flush(10)
        assert (await a.balance(meter, external_customer_id="c1")).consumed == 1
    ((events, reason),) = dropped
    assert [len(e["metadata"]) for e in events] == [15]
    assert reason == "larger than an ingestion request may be (4096 bytes)"
    assert counters(emulator)["events"] == 1
