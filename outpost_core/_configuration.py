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
        """``(reducer id, value)`` for every bucketed reducer the event counts in."""
        out: list[tuple[str, float]] = []
        for reducer in self.reducers.values():
            if not reducer.aggregation.bucketed() or not reducer.filter.matches(event):
                continue
            value = reducer.aggregation.value_of(event)
            if value is not None:
                out.append((reducer.id, value))
        return out

    def reducer_for(self, meter_id: str) -> Reducer | None:
        reducer_id = self.meter_reducers.get(meter_id)
        return None if reducer_id is None else self.reducers.get(reducer_id)


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
