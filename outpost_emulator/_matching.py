"""Does an event match a meter filter, and what does it contribute to an aggregation?

`sql_*` follow Polar's SQL (`get_sql_clause` / `get_sql_column`), which fills the Postgres bucket
rows and customer meters; that is what the emulator computes everywhere. `python_matches` follows
Polar's `Filter.matches` (the real-time Redis rollup, and the SDK's local matching). It exists so
the tests can pin every place where the two disagree; the list, with an example each, is in
docs/emulator.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from outpost_emulator._model import Aggregation, Clause, ClauseValue, Filter, StoredEvent

_MISSING = object()
# Polar's Event._filterable_fields: the event columns a clause can name.
COLUMNS = ("timestamp", "name", "source")


def metadata_path(metadata: dict[str, Any], prop: str) -> Any:
    """`user_metadata -> 'a' -> 'b'`: _MISSING when a step is absent or not an object."""
    value: Any = metadata
    for part in prop.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def sql_epoch_seconds(t_us: int) -> int:
    # CAST(EXTRACT(epoch FROM timestamp) AS BIGINT): numeric -> bigint rounds half away from 0.
    magnitude = (abs(t_us) + 500_000) // 1_000_000
    return magnitude if t_us >= 0 else -magnitude


def python_epoch_seconds(t_us: int) -> int:
    # int(event.timestamp.timestamp()): truncation toward zero.
    return int(t_us / 1_000_000)


# SQL -----------------------------------------------------------------------------------------


def sql_matches(filter_: Filter, event: StoredEvent) -> bool:
    """WHERE semantics: only TRUE keeps the row (FALSE and NULL drop it)."""
    return _sql_filter(filter_, event) is True


def _sql_filter(filter_: Filter, event: StoredEvent) -> bool | None:
    if not filter_.clauses:
        return True  # and_(true()) / or_(true())
    results = [
        _sql_filter(c, event) if isinstance(c, Filter) else _sql_clause(c, event)
        for c in filter_.clauses
    ]
    if filter_.conjunction == "and":
        if False in results:
            return False
        return None if None in results else True
    if True in results:
        return True
    return None if None in results else False


def _str_value(value: ClauseValue) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)


def _compare(op: str, actual: Any, expected: Any) -> bool:
    if op == "eq":
        return bool(actual == expected)
    if op == "ne":
        return bool(actual != expected)
    if op == "gt":
        return bool(actual > expected)
    if op == "gte":
        return bool(actual >= expected)
    if op == "lt":
        return bool(actual < expected)
    if op == "lte":
        return bool(actual <= expected)
    if op == "like":
        return bool(str(expected) in str(actual))
    return bool(str(expected) not in str(actual))  # not_like


def _sql_clause(clause: Clause, event: StoredEvent) -> bool | None:
    op, value = clause.operator, clause.value
    if clause.property in COLUMNS:
        column: Any
        if clause.property == "timestamp":
            # isinstance(True, int) holds in Polar too; Postgres then fails on bigint = boolean.
            # The emulator treats that clause as false.
            if not isinstance(value, int) or (
                isinstance(value, bool) and op not in ("like", "not_like")
            ):
                return False
            column = sql_epoch_seconds(event.timestamp_us)
        else:
            if not isinstance(value, str):
                return False
            column = event.name if clause.property == "name" else event.source
        if op in ("like", "not_like"):
            return _compare(op, str(column), _str_value(value))
        return _compare(op, column, value)

    actual = metadata_path(event.metadata, clause.property)
    if actual is _MISSING or actual is None:
        return None  # missing key or JSON null: NULL
    if op in ("like", "not_like"):
        return _compare(op, jsonb_text(actual), _str_value(value))
    if isinstance(actual, str):
        return _compare(op, actual, _str_value(value))
    if isinstance(actual, bool):
        return _compare(op, actual, value) if isinstance(value, bool) else False
    if isinstance(actual, int | float):
        # The value is an int or a bool (bool as 1/0); a string value never matches a number.
        return _compare(op, float(actual), float(value)) if not isinstance(value, str) else False
    return None  # object or array: the CASE has no branch, so NULL


def jsonb_text(value: Any) -> str:
    """`->>` text of a JSON value, as Postgres renders it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        return format(Decimal(text), "f") if "e" in text else text
    return json.dumps(_jsonb_order(value), separators=(", ", ": "), ensure_ascii=False)


def _jsonb_order(value: Any) -> Any:
    # jsonb stores object keys shortest first, then bytewise.
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: _jsonb_order(value[k]) for k in keys}
    if isinstance(value, list):
        return [_jsonb_order(v) for v in value]
    return value


def sql_value(aggregation: Aggregation, event: StoredEvent) -> float | None:
    """What a matching event adds to a count/sum/min/max/avg; None: it is left out.

    count -> 1. A property aggregation needs `jsonb_typeof = 'number'` (so never a bool), or the
    `timestamp` column (epoch seconds); `name` and `source` never qualify.
    """
    if aggregation.func == "count":
        return 1.0
    prop = aggregation.property or ""
    if prop in COLUMNS:
        return float(sql_epoch_seconds(event.timestamp_us)) if prop == "timestamp" else None
    actual = metadata_path(event.metadata, prop)
    if isinstance(actual, bool) or not isinstance(actual, int | float):
        return None
    return float(actual)


def sql_unique_key(aggregation: Aggregation, event: StoredEvent) -> str | None:
    """The jsonb value `count(DISTINCT user_metadata -> path)` sees (always a metadata path)."""
    actual = metadata_path(event.metadata, aggregation.property or "")
    if actual is _MISSING:
        return None  # SQL NULL is not counted; a JSON null is a value
    return json.dumps(_canonical(actual), sort_keys=True)


def _canonical(value: Any) -> Any:
    # jsonb equality compares numbers numerically: 1 and 1.0 are one value.
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return ["#", str(Decimal(repr(value)).normalize())]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return [_canonical(v) for v in value]


def contribution(filter_: Filter, aggregation: Aggregation, event: StoredEvent) -> float | None:
    """The value an event adds to a reducer or meter, or None when it does not count."""
    if not sql_matches(filter_, event):
        return None
    return sql_value(aggregation, event)


def consumed(filter_: Filter, aggregation: Aggregation, events: Iterable[StoredEvent]) -> float:
    """A meter's quantity over `events`, as Polar's SQL aggregation computes it."""
    if aggregation.func == "unique":
        keys = {sql_unique_key(aggregation, e) for e in events if sql_matches(filter_, e)}
        keys.discard(None)
        return float(len(keys))
    values = [v for e in events if (v := contribution(filter_, aggregation, e)) is not None]
    if aggregation.func == "count":
        return float(len(values))
    if not values:
        return 0.0  # sum/avg/min/max of nothing: Polar reports 0
    if aggregation.func == "sum":
        return math.fsum(values)
    if aggregation.func == "avg":
        return math.fsum(values) / len(values)
    return min(values) if aggregation.func == "min" else max(values)


# Python (Polar's Filter.matches), for the documented differences -----------------------------


def python_matches(filter_: Filter, event: StoredEvent) -> bool:
    results = [
        python_matches(c, event) if isinstance(c, Filter) else _python_clause(c, event)
        for c in filter_.clauses
    ]
    if filter_.conjunction == "and":
        return all(results) if results else True
    return any(results) if results else True


def _python_clause(clause: Clause, event: StoredEvent) -> bool:
    value = clause.value
    actual: Any
    if clause.property in ("name", "source"):
        if not isinstance(value, str):
            return False
        actual = event.name if clause.property == "name" else event.source
    elif clause.property == "timestamp":
        if not isinstance(value, int):
            return False
        actual = python_epoch_seconds(event.timestamp_us)
    else:
        actual = metadata_path(event.metadata, clause.property)
        if actual is _MISSING or actual is None:
            return False
    try:
        return _compare(clause.operator, actual, value)
    except TypeError:
        return False
