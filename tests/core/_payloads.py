"""Polar's configuration payloads for the core tests (no Redis, no I/O)."""

from __future__ import annotations

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
