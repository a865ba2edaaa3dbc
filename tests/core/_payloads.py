"""Polar's configuration payloads for the core tests (no Redis, no I/O)."""

from __future__ import annotations

from typing import Any

COUNT = "m-count"
TOKENS = "m-tokens"
LARGEST = "m-largest"
SMALLEST = "m-smallest"
AVERAGE = "m-average"
UNIQUE = "m-unique"


def reducer(
    reducer_id: str,
    meter_ids: list[str],
    *,
    func: str = "count",
    prop: str | None = None,
    clauses: list[dict[str, Any]] | None = None,
    conjunction: str = "and",
) -> dict[str, Any]:
    aggregation: dict[str, Any] = {"func": func}
    if prop is not None:
        aggregation["property"] = prop
    return {
        "id": reducer_id,
        "filter": {"conjunction": conjunction, "clauses": clauses or []},
        "aggregation": aggregation,
        "meter_ids": meter_ids,
    }


def configuration(*reducers: dict[str, Any]) -> dict[str, Any]:
    return {"organization_id": "org", "meters": [], "reducers": list(reducers)}


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
