"""Polar's configuration payloads and snapshot messages for the core tests (no Redis, no I/O)."""

from __future__ import annotations

from typing import Any

from tests.support.payloads import configuration as configuration
from tests.support.payloads import reducer as reducer

COUNT = "m-count"
TOKENS = "m-tokens"
LARGEST = "m-largest"
SMALLEST = "m-smallest"
AVERAGE = "m-average"
UNIQUE = "m-unique"


STANDARD = configuration(
    reducer(
        "r-count",
        [COUNT],
        clauses=[{"property": "name", "operator": "eq", "value": "api_call"}],
    ),
    reducer("r-tokens", [TOKENS], func="sum", prop="tokens"),
    reducer("r-largest", [LARGEST], func="max", prop="tokens"),
    reducer("r-smallest", [SMALLEST], func="min", prop="tokens"),
    reducer("r-average", [AVERAGE], func="avg", prop="tokens"),
    reducer("r-unique", [UNIQUE], func="unique", prop="user"),
)


def snapshot_message(
    request_id: str | None,
    customer: str,
    *,
    as_of: int,
    cold_until: int,
    reducers: dict[str, Any],
    credited: dict[str, float],
    **extra: Any,
) -> dict[str, Any]:
    """Polar's ``snapshot`` message for the external ``customer`` (``snap-1``); ``extra`` adds
    fields or replaces them."""
    payload = {
        "request_id": request_id,
        "snapshot_id": "snap-1",
        "external_customer_id": customer,
        "as_of": as_of,
        "cold_until": cold_until,
        "reducers": reducers,
        "credited": credited,
        **extra,
    }
    return {"type": "snapshot", "payload": payload}
