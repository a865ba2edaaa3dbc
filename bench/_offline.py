"""What the benchmarks that run without Polar share: a one-meter configuration stored in Redis,
and customers warmed with the apply_snapshot script (nothing counted yet, credit for any run)."""

from __future__ import annotations

import time
from typing import Any

from outpost_core import Aggregate, Customer, floor_bucket
from tests.support import polar

METER = "m-calls"
CONFIGURATION = polar.configuration(
    polar.reducer(
        "r-calls", [METER], clauses=[{"property": "name", "operator": "eq", "value": "api_call"}]
    )
)


def prepare(client: Any, *customers: str) -> None:
    """Store :data:`CONFIGURATION` and apply each customer a snapshot counting nothing."""
    polar.store_configuration(client, CONFIGURATION)
    now = time.time_ns() // 1000
    for name in customers:
        polar.apply_snapshot(
            client,
            Customer("external", name),
            cold_until=floor_bucket(now),
            as_of=now,
            now=now,
            totals={"r-calls": Aggregate()},
            credited={METER: 1e12},
        )
