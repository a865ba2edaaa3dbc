"""Meter filters and aggregations with Polar's SQL semantics (``get_sql_clause``).

Polar's Postgres sync, its customer meters and its billing match events in SQL; its real-time
rollup, and ``_filters``, match them in Python. Where the two disagree, the core counts an event
if either counts it (``Configuration.contributions``, docs/design.md), so it needs the SQL answer
too.
docs/emulator.md lists every disagreement with an example.

The SQL rules:
- ``name`` and ``source`` compare only with a string value, ``timestamp`` only with an integer;
  Postgres rounds the timestamp to the nearest whole second (``CAST(EXTRACT(epoch) AS BIGINT)``)
  where Python truncates;
- a metadata value is read by its JSON type: a string compares as text with ``str(value)`` (a bool
  value as ``'t'``/``'f'``), a number as a float with an int or bool value (else false), a boolean
  only with a bool value; a missing key, a JSON null, an object or an array is SQL's NULL;
- ``like`` / ``not_like`` look for the value's text in the ``->>`` text of the JSON value. Polar's
  code has been seen both escaping the value (a literal substring) and not
  (``LIKE '%v%'``: ``%`` and ``_`` in the value are wildcards, a backslash escapes). The SDK cannot
  tell which one runs, so a clause holds here if it holds under either reading;
- a dotted property (``_cost.amount``) is a path into the metadata in Polar's Python and in its
  aggregations, but Polar's filter SQL has been seen to read it as one key named with the dot
  (``user_metadata -> '_cost.amount'``); metadata may hold such a key. A clause holds here if it
  holds under either reading, and a value is the larger of the two;
- a filter keeps a row only when it is TRUE. Filters combine clauses with ``and`` / ``or`` and never
  negate a group, so a NULL clause decides exactly like a false one: it is false here.

Two things are approximated, as in the emulator: strings order by code point (Postgres uses the
database's collation, which the SDK cannot know), and an object's text assumes Polar stored the
object as the SDK sent it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from ._filters import OPERATORS, Aggregation, Clause, EventView, Filter, lookup

_HALF_SECOND_US = 500_000


def sql_matches(filter_: Filter, event: EventView) -> bool:
    """Whether Polar's SQL keeps the event: an empty ``and`` or ``or`` is TRUE."""
    if not filter_.clauses:
        return True
    wanted = filter_.conjunction == "or"  # the answer that decides the group at once
    for item in filter_.clauses:
        found = (
            sql_matches(item, event) if isinstance(item, Filter) else clause_matches(item, event)
        )
        if found is wanted:
            return wanted
    return not wanted


def clause_matches(clause: Clause, event: EventView) -> bool:
    """One clause in SQL: TRUE is ``True``; FALSE and NULL are ``False``."""
    op, value = clause.operator, clause.value
    if clause.property in ("name", "source"):
        if not isinstance(value, str):
            return False
        return _compare(op, event.name if clause.property == "name" else event.source, value)
    if clause.property == "timestamp":
        if not isinstance(value, int):
            return False
        seconds = sql_epoch_seconds(event)
        if op in ("like", "not_like"):
            # The column is cast to text; a bool value (Polar lets it through: it is an int) is
            # 't' / 'f', so `not_like false` holds for every event.
            return _compare(op, str(seconds), _text(value))
        # Postgres refuses bigint against boolean: the query fails and counts nothing.
        return not isinstance(value, bool) and _compare(op, seconds, value)
    prop, metadata = clause.property, event.metadata
    if "." in prop and prop in metadata and _metadata_matches(op, value, metadata[prop]):
        return True  # the property read as one key
    return _metadata_matches(op, value, lookup(metadata, prop))


def _metadata_matches(op: str, value: str | int | bool, actual: Any) -> bool:
    if actual is None:
        return False  # a missing key or a JSON null: NULL
    if op in ("like", "not_like"):
        return _compare(op, jsonb_text(actual), _text(value))
    if isinstance(actual, str):
        return _compare(op, actual, _text(value))
    if isinstance(actual, bool):
        return isinstance(value, bool) and _compare(op, actual, value)
    if isinstance(actual, (int, float)):  # a tuple: faster than a union on this path
        return not isinstance(value, str) and _compare(op, float(actual), float(value))
    return False  # an object or an array: the CASE has no branch, NULL


def sql_value(aggregation: Aggregation, event: EventView) -> float | None:
    """What Polar's SQL adds for a matching event; ``None``: the event is left out.

    A property needs ``jsonb_typeof = 'number'`` (so never a bool or a numeric string); the
    ``timestamp`` column gives its rounded epoch seconds; ``name`` and ``source`` never qualify.
    """
    if aggregation.func == "count":
        return 1.0
    prop = aggregation.property
    assert prop is not None
    if prop == "timestamp":
        return float(sql_epoch_seconds(event))
    if prop in ("name", "source"):
        return None
    found = [_number(lookup(event.metadata, prop))]
    if "." in prop:
        found.append(_number(event.metadata.get(prop)))  # the property read as one key
    return max((v for v in found if v is not None), default=None)


def _number(actual: Any) -> float | None:
    if isinstance(actual, bool) or not isinstance(actual, int | float):
        return None
    return float(actual)


def sql_epoch_seconds(event: EventView) -> int:
    """The event's epoch seconds rounded half up, as ``numeric`` -> ``bigint`` does for t >= 0."""
    return event.timestamp_s + (1 if event.subsecond_us >= _HALF_SECOND_US else 0)


def jsonb_text(value: Any) -> str:
    """The ``->>`` text of a JSON value as Postgres renders it."""
    if isinstance(value, str):
        return value
    return _jsonb(value)


def _jsonb(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # jsonb keeps a number as `numeric`, printed without an exponent and without a sign on
        # zero: 1e20 is 100000000000000000000, -0.0 is 0.0 (were the sign kept, a `like "-"`
        # would still count through Python's "-0.0").
        text = repr(abs(value) if value == 0 else value)
        return format(Decimal(text), "f") if "e" in text else text
    if isinstance(value, Mapping):
        # jsonb orders keys by their length in bytes, then bytewise.
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return "{" + ", ".join(f"{_jsonb(k)}: {_jsonb(value[k])}" for k in keys) + "}"
    return "[" + ", ".join(_jsonb(item) for item in value) + "]"


def _text(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)


def _compare(op: str, actual: Any, expected: Any) -> bool:
    compare = OPERATORS.get(op)
    if compare is not None:
        return bool(compare(actual, expected))
    if op == "like":
        return expected in actual or _unescaped_like(expected, actual)
    return expected not in actual or not _unescaped_like(expected, actual)  # not_like


def _unescaped_like(value: str, text: str) -> bool:
    """``text LIKE '%' || value || '%'`` with Postgres's default escape character, ``\\``."""
    if _LIKE_SPECIAL.search(value) is None:
        return value in text
    return _like_pattern(f"%{value}%").fullmatch(text) is not None


_LIKE_SPECIAL = re.compile(r"[%_\\]")


@functools.lru_cache(maxsize=256)
def _like_pattern(pattern: str) -> re.Pattern[str]:
    parts: list[str] = []
    chars = iter(pattern)
    for c in chars:
        if c == "\\":
            # The next character is literal. A value ending in a backslash thus escapes the closing
            # "%": the text must end with the rest of the value and a literal "%".
            parts.append(re.escape(next(chars, "")))
        elif c == "%":
            parts.append(".*")
        elif c == "_":
            parts.append(".")
        else:
            parts.append(re.escape(c))
    return re.compile("".join(parts), re.DOTALL)
