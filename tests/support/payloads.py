"""Polar's configuration payload, built in tests: reducers and the configuration that holds them."""

from __future__ import annotations

from typing import Any


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
