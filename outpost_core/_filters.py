"""Meter filters and aggregations with Polar's server-side Python semantics.

Polar's real-time rollup matches events in Python (``Filter.matches``); its Postgres sync, billing
and meter reads match in SQL, which differs in a few type-mixing cases. This module follows the
Python semantics, as the rollup does; ``_sql_filters`` follows the SQL ones, and an event counts
locally if either counts it (docs/design.md). docs/emulator.md lists every difference with an
example.

The rules, in order:
- an empty ``and`` and an empty ``or`` both match;
- ``name`` and ``source`` compare only with a string value, ``timestamp`` (whole epoch seconds)
  only with an integer (a bool is one: ``timestamp gt true`` holds); another value never matches;
- any other property is a dot path into the metadata; a missing or null value matches nothing,
  not even ``ne``;
- comparisons are Python's operators (so ``True == 1`` holds and ``"3" == 3`` does not), and a
  comparison Python refuses (``"a" > 1``) does not match;
- ``like`` / ``not_like`` test whether ``str(value)`` occurs in ``str(actual)``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import attrs

OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "gt": operator.gt,
    "gte": operator.ge,
    "lt": operator.lt,
    "lte": operator.le,
}
_LIKE = ("like", "not_like")
_INT32 = (-(2**31), 2**31 - 1)
COLUMNS = ("name", "source", "timestamp")
BUCKETED_FUNCS = ("count", "sum", "avg", "min", "max")
ALL_FUNCS = (*BUCKETED_FUNCS, "unique")


class InvalidDefinition(ValueError):
    """A filter or aggregation from Polar that does not follow Polar's schema."""


@attrs.frozen(slots=True)
class EventView:
    """What a filter can look at: the event's columns and its metadata."""

    name: str
    timestamp_s: int
    """Whole epoch seconds, truncated as Polar's Python does."""
    metadata: Mapping[str, Any]
    source: str = "user"
    subsecond_us: int = 0
    """Microseconds past ``timestamp_s``: Polar's SQL rounds to the nearest second instead."""


@attrs.frozen(slots=True)
class Clause:
    property: str
    operator: str
    value: str | int | bool

    def matches(self, event: EventView) -> bool:
        if self.property == "name" or self.property == "source":
            if not isinstance(self.value, str):
                return False
            actual: Any = event.name if self.property == "name" else event.source
        elif self.property == "timestamp":
            if not isinstance(self.value, int):  # a bool passes, as in Polar: True is the int 1
                return False
            actual = event.timestamp_s
        else:
            actual = lookup(event.metadata, self.property)
            if actual is None:
                return False
        if self.operator in _LIKE:
            found = str(self.value) in str(actual)
            return found if self.operator == "like" else not found
        try:
            return bool(OPERATORS[self.operator](actual, self.value))
        except TypeError:
            return False


@attrs.frozen(slots=True)
class Filter:
    conjunction: str
    clauses: tuple[Clause | Filter, ...]

    def matches(self, event: EventView) -> bool:
        if not self.clauses:
            return True
        if self.conjunction == "and":
            return all(clause.matches(event) for clause in self.clauses)
        return any(clause.matches(event) for clause in self.clauses)


@attrs.frozen(slots=True)
class Aggregation:
    func: str
    property: str | None = None

    def bucketed(self) -> bool:
        """Whether buckets of count, sum, min and max can produce this aggregation."""
        return self.func in BUCKETED_FUNCS

    def value_of(self, event: EventView) -> float | None:
        """The event's contribution, or ``None`` when it contributes nothing."""
        if self.func == "count":
            return 1.0
        assert self.property is not None
        if self.property == "timestamp":
            return float(event.timestamp_s)
        if self.property in ("name", "source"):
            return None
        value = lookup(event.metadata, self.property)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)


def lookup(metadata: Mapping[str, Any], path: str) -> Any:
    """Follow a dot path (``_llm.total_tokens``) into metadata; ``None`` when absent."""
    current: Any = metadata
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return None
        current = current[part]
    return current


def _strip(prop: str) -> str:
    return prop[len("metadata.") :] if prop.startswith("metadata.") else prop


def parse_filter(obj: object, depth: int = 0) -> Filter:
    """Build a filter from Polar's JSON, refusing what Polar's schema refuses."""
    if depth > 32:
        raise InvalidDefinition("filter nested more than 32 levels")
    if not isinstance(obj, Mapping):
        raise InvalidDefinition("a filter must be an object")
    conjunction = obj.get("conjunction")
    if conjunction not in ("and", "or"):
        raise InvalidDefinition(f"unknown conjunction {conjunction!r}")
    raw = obj.get("clauses")
    if not isinstance(raw, list):
        raise InvalidDefinition("a filter's clauses must be a list")
    clauses: list[Clause | Filter] = []
    for item in raw:
        if isinstance(item, Mapping) and "conjunction" in item:
            clauses.append(parse_filter(item, depth + 1))
        else:
            clauses.append(_parse_clause(item))
    return Filter(conjunction=conjunction, clauses=tuple(clauses))


def _parse_clause(obj: object) -> Clause:
    if not isinstance(obj, Mapping):
        raise InvalidDefinition("a clause must be an object")
    prop, op, value = obj.get("property"), obj.get("operator"), obj.get("value")
    if not isinstance(prop, str) or not prop:
        raise InvalidDefinition("a clause needs a property")
    if not isinstance(op, str) or (op not in OPERATORS and op not in _LIKE):
        raise InvalidDefinition(f"unknown operator {op!r}")
    if isinstance(value, str):
        if len(value) > 1000:
            raise InvalidDefinition("a clause value is at most 1000 characters")
    elif isinstance(value, int) and not isinstance(value, bool):
        if not _INT32[0] <= value <= _INT32[1]:
            raise InvalidDefinition("an integer clause value must fit in 32 bits")
    elif not isinstance(value, bool):
        raise InvalidDefinition("a clause value is a string, a 32-bit integer or a boolean")
    return Clause(property=_strip(prop), operator=str(op), value=value)


def parse_aggregation(obj: object) -> Aggregation:
    if not isinstance(obj, Mapping):
        raise InvalidDefinition("an aggregation must be an object")
    func = obj.get("func")
    if func not in ALL_FUNCS:
        raise InvalidDefinition(f"unknown aggregation {func!r}")
    if func == "count":
        return Aggregation(func="count")
    prop = obj.get("property")
    if not isinstance(prop, str) or not prop:
        raise InvalidDefinition(f"aggregation {func!r} needs a property")
    return Aggregation(func=str(func), property=_strip(prop))
