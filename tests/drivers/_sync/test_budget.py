# GENERATED from tests/drivers/_async/test_budget.py by scripts/unasync.py: do not edit.
"""One request budget for every instance of an organization (D13), against the emulator's limit."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from outpost_emulator import Emulator
from outpost_sync import Outpost
from tests.drivers._sync._concurrency import run_concurrently
from tests.drivers._sync._helpers import connect, count_meter
from tests.drivers._sync.test_metering import counters
from tests.support.redis_server import RedisServer

LIMIT = 60  # the emulator's requests a minute
SHARE = 56  # the instances' budget: a full bucket (3) and a minute of refill stay under LIMIT


@pytest.fixture
def limited() -> Iterator[Emulator]:
    with Emulator.start(port=0, sync_delay=1.0, rate_limit=LIMIT) as emu:
        yield emu


def test_busy_instances_share_one_budget_and_get_no_429(
    redis_server: RedisServer, limited: Emulator
) -> None:
    count_meter(limited)
    instances = [
        connect(redis_server, limited, requests_per_minute=SHARE, batch_size=10) for _ in range(3)
    ]
    try:

        def busy(outpost: Outpost) -> Callable[[], None]:
            def track() -> None:
                for i in range(300):
                    outpost.track("api_call", external_customer_id=f"c{i % 5}")

            return track

        run_concurrently([busy(outpost) for outpost in instances])
        for outpost in instances:
            assert outpost.flush(60)
    finally:
        for outpost in instances:
            outpost.close()
    seen = counters(limited)
    assert (seen["events"], seen["events_duplicate"]) == (900, 0)
    # Without a shared budget, 900 events in batches of 10 are some 90 requests: 429s.
    assert seen.get("http_rate_limited", 0) == 0
    assert seen["http_ingest"] < LIMIT
