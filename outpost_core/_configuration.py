"""Polar's configuration: the reducers and the meters they serve.

It arrives in the WebSocket ``configuration`` message and is cached in Redis, so an instance that
starts while Polar is unreachable still reduces events the way Polar does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ._filters import (
    Aggregation,
    EventView,
    Filter,
    InvalidDefinition,
    parse_aggregation,
    parse_filter,
)
from ._sql_filters import sql_matches, sql_value


@attrs.frozen(slots=True)
class Reducer:
    id: str
    filter: Filter
    aggregation: Aggregation
    meter_ids: tuple[str, ...]


@attrs.frozen(slots=True)
class Configuration:
    reducers: Mapping[str, Reducer]
    meter_reducers: Mapping[str, str]
    """Meter id → the id of the reducer that serves it."""
    problems: tuple[str, ...] = ()
    """Why some reducers of the payload were left out (each is counted as a rejection)."""
    organization_id: str | None = None

    def contributions(self, event: EventView) -> list[tuple[str, float]]:
        """``(reducer id, value)`` for every bucketed reducer the event counts in.

        On the safe side of Polar's two matchings (an event counts if either counts it): see
        :func:`counts` and :func:`safe_value`.
        """
        out: list[tuple[str, float]] = []
        for reducer in self.reducers.values():
            if not reducer.aggregation.bucketed() or not counts(reducer.filter, event):
                continue
            value = safe_value(reducer.aggregation, event)
            if value is not None:
                out.append((reducer.id, value))
        return out

    def reducer_for(self, meter_id: str) -> Reducer | None:
        reducer_id = self.meter_reducers.get(meter_id)
        return None if reducer_id is None else self.reducers.get(reducer_id)


def counts(filter_: Filter, event: EventView) -> bool:
    """Whether the event counts locally: Polar's Python matching or its SQL matching counts it.

    Billing follows SQL, so counting every event SQL counts keeps local consumption at or above
    Polar's; the events only Python counts (Polar's real-time rollup) are over-counted until a
    snapshot covers their bucket, which is the safe side. The OR applies to the whole filter, each
    dialect evaluating every clause and nested group its own way: an OR per clause would also count
    events that neither side ever counts (an ``and`` of a clause only SQL holds and a clause only
    Python holds), with nothing gained. Groups only combine with ``and`` / ``or``, so either answer
    is monotone in its clauses and SQL's NULL decides like FALSE (``_sql_filters``).
    """
    return filter_.matches(event) or sql_matches(filter_, event)


def safe_value(aggregation: Aggregation, event: EventView) -> float | None:
    """The larger of the two dialects' values for a counted event; ``None``: it adds nothing.

    Both take a property only when it is a number (never a bool or a numeric string); they differ
    on ``timestamp`` alone, which SQL rounds to the nearest second and Python truncates. The larger
    keeps a sum and a max at or above Polar's, and an average too for the same events; a min can be
    made safe by no choice, since any pending event may lower it (docs/invariant.md).
    """
    if aggregation.property == "timestamp":
        return sql_value(aggregation, event)  # the rounded seconds: never below the truncated
    python, sql = aggregation.value_of(event), sql_value(aggregation, event)
    if python is None or sql is None:
        # They differ only on a dotted property that metadata also holds as one key.
        return python if sql is None else sql
    return max(python, sql)


def parse_configuration(payload: object) -> Configuration:
    """Parse the ``configuration`` payload; a malformed reducer is left out, not fatal."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("reducers"), list):
        raise InvalidDefinition("configuration payload needs a list of reducers")
    reducers: dict[str, Reducer] = {}
    meter_reducers: dict[str, str] = {}
    problems: list[str] = []
    for index, item in enumerate(payload["reducers"]):
        try:
            reducer = _parse_reducer(item)
        except InvalidDefinition as exc:
            problems.append(f"reducer #{index}: {exc}")
            continue
        reducers[reducer.id] = reducer
        for meter_id in reducer.meter_ids:
            meter_reducers[meter_id] = reducer.id
    organization = payload.get("organization_id")
    return Configuration(
        reducers=reducers,
        meter_reducers=meter_reducers,
        problems=tuple(problems),
        organization_id=organization if isinstance(organization, str) else None,
    )


def _parse_reducer(item: Any) -> Reducer:
    if not isinstance(item, Mapping):
        raise InvalidDefinition("a reducer must be an object")
    reducer_id, meter_ids = item.get("id"), item.get("meter_ids")
    if not isinstance(reducer_id, str) or not reducer_id:
        raise InvalidDefinition("a reducer needs an id")
    if not isinstance(meter_ids, list) or not all(isinstance(m, str) for m in meter_ids):
        raise InvalidDefinition("a reducer's meter_ids must be a list of strings")
    return Reducer(
        id=reducer_id,
        filter=parse_filter(item.get("filter")),
        aggregation=parse_aggregation(item.get("aggregation")),
        meter_ids=tuple(meter_ids),
    )
