"""Counting on the safe side when Polar's two matchings disagree (an event counts if either
counts it), both drivers, against the emulator (which bills with Polar's SQL matching) and real
Redis.

Whatever the filter, the local balance must never read above Polar's: right after the event is
tracked (Polar holds it, no snapshot covers it yet) and after a snapshot covers its bucket.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from outpost_async import AsyncOutpost
from outpost_core import floor_bucket, to_us
from outpost_emulator import Emulator
from tests.drivers._async._helpers import connect, eventually
from tests.support.redis_server import RedisServer

CREDITS = 100


def one_clause(prop: str, op: str, value: Any) -> dict[str, Any]:
    return {"conjunction": "and", "clauses": [{"property": prop, "operator": op, "value": value}]}


def at_fraction(now: datetime, microsecond: int) -> datetime:
    """An instant at ``microsecond`` past a whole second, not after ``now``."""
    instant = now.replace(microsecond=microsecond)
    return instant if instant <= now else instant - timedelta(seconds=1)


CASES = [
    # SQL (billing) counts it, Python does not: "2" > "1" as text.
    pytest.param(one_clause("n", "gt", 1), {"func": "count"}, {"n": "2"}, None, id="sql-only"),
    # Python counts it (True == 1), SQL does not: over-counted until the snapshot.
    pytest.param(one_clause("b", "eq", 1), {"func": "count"}, {"b": True}, None, id="python-only"),
    # Both count it, with different values: SQL rounds x.6 s up, Python truncates.
    pytest.param(
        {"conjunction": "and", "clauses": []},
        {"func": "sum", "property": "timestamp"},
        {},
        600_000,
        id="timestamp-sum",
    ),
]


async def polar_and_local(
    instance: AsyncOutpost, emulator: Emulator, meter: str
) -> tuple[dict[str, Any], Any]:
    polar = emulator.customer_meter(meter, external_customer_id="c1")
    local = await instance.balance(meter, external_customer_id="c1")
    return polar, local


@pytest.mark.anyio
@pytest.mark.parametrize(("filter_", "aggregation", "metadata", "fraction_us"), CASES)
async def test_the_local_balance_never_reads_above_polars_when_the_matchings_disagree(
    redis_server: RedisServer,
    emulator: Emulator,
    filter_: dict[str, Any],
    aggregation: dict[str, Any],
    metadata: dict[str, Any],
    fraction_us: int | None,
) -> None:
    meter = str(emulator.create_meter("disagreeing", filter_, aggregation)["id"])
    emulator.grant_credits(meter, CREDITS, external_customer_id="c1")
    async with connect(redis_server, emulator) as a:
        assert (await a.balance(meter, external_customer_id="c1")).balance == CREDITS
        now = emulator.clock.now()
        timestamp = None if fraction_us is None else at_fraction(now, fraction_us)
        await a.track("api_call", external_customer_id="c1", metadata=metadata, timestamp=timestamp)
        tracked_bucket = floor_bucket(to_us(timestamp or now))
        assert await a.flush(10)  # Polar holds the event: its customer meter counts it now
        polar, local = await polar_and_local(a, emulator, meter)
        assert local.balance <= polar["balance"], (local, polar)
        assert local.consumed >= polar["consumed_units"] and local.pending == 1

        emulator.advance(6 * 60)  # the bucket closes and syncs
        emulator.grant_credits(meter, 1, external_customer_id="c1")  # and a snapshot is pushed

        async def covered() -> bool:
            b = await a.balance(meter, external_customer_id="c1")
            return (
                b.pending == 0
                and b.cold_until is not None
                and to_us(b.cold_until) > tracked_bucket
                and b.credited == CREDITS + 1
            )

        await eventually(covered, what="a snapshot counting the event's bucket")
        polar, local = await polar_and_local(a, emulator, meter)
        assert local.balance <= polar["balance"], (local, polar)
        assert local.balance == polar["balance"]  # and the snapshot corrected any over-count
