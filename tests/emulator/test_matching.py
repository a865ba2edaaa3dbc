"""Polar's SQL matching (what the emulator computes) against its Python matching (what the
SDK's local reduction follows). Every row where they differ is listed in docs/emulator.md."""

from __future__ import annotations

from typing import Any

import pytest

from outpost_emulator._matching import (
    consumed,
    jsonb_text,
    python_matches,
    sql_matches,
    sql_value,
)
from outpost_emulator._model import Aggregation, Clause, Filter, StoredEvent
from tests.emulator.helpers import START_US


def make_event(name: str = "api_call", at: int = START_US, **metadata: Any) -> StoredEvent:
    return StoredEvent(
        seq=1,
        name=name,
        timestamp_us=at,
        identity=("external_customer_id", "c1"),
        external_id=None,
        metadata=metadata,
        ingested_at_us=at,
    )


def one_clause(prop: str, op: Any, value: Any) -> Filter:
    return Filter("and", (Clause(prop, op, value),))


# (property, operator, clause value, metadata, SQL result, Python result)
DIFFERENCES = [
    ("n", "eq", 3, {"n": "3"}, True, False),  # string vs number: SQL compares text
    ("s", "gt", 5, {"s": "abc"}, True, False),  # text order vs TypeError
    ("s", "eq", True, {"s": "t"}, True, False),  # bool value as 't'/'f' text
    ("b", "eq", 1, {"b": True}, False, True),  # JSON boolean only equals a bool in SQL
    ("n", "ne", "x", {"n": 3}, False, True),  # type mismatch: SQL false, Python ne true
    ("b", "ne", "x", {"b": True}, False, True),
    ("o", "ne", "x", {"o": {"a": 1}}, False, True),  # object/array: SQL NULL
    ("b", "like", "tr", {"b": True}, True, False),  # SQL text 'true', Python 'True'
    ("f", "like", "000", {"f": 1e20}, True, False),  # '100000000000000000000' vs '1e+20'
    ("o", "like", '"a"', {"o": {"a": 1}}, True, False),  # JSON text vs Python repr
    ("s", "like", True, {"s": "total"}, True, False),  # SQL looks for 't', Python for 'True'
]


@pytest.mark.parametrize(("prop", "op", "value", "metadata", "sql", "python"), DIFFERENCES)
def test_sql_and_python_matching_differ(
    prop: str, op: str, value: Any, metadata: dict[str, Any], sql: bool, python: bool
) -> None:
    event = make_event(**metadata)
    assert sql_matches(one_clause(prop, op, value), event) is sql
    assert python_matches(one_clause(prop, op, value), event) is python


def test_timestamp_rounding_differs() -> None:
    # 15:02:00.6: SQL's CAST(EXTRACT(epoch) AS BIGINT) rounds up, Python's int() truncates.
    event = make_event(at=START_US + 600_000)
    seconds = START_US // 1_000_000
    assert sql_matches(one_clause("timestamp", "eq", seconds + 1), event)
    assert python_matches(one_clause("timestamp", "eq", seconds), event)
    assert not sql_matches(one_clause("timestamp", "eq", seconds), event)
    assert sql_value(Aggregation("sum", "timestamp"), event) == float(seconds + 1)


AGREEMENTS = [
    ("n", "eq", 3, {"n": 3.0}, True),
    ("n", "gte", 3, {"n": 2.5}, False),
    ("n", "eq", True, {"n": 1}, True),  # bool value as 1 against a number, in both
    ("s", "eq", "x", {"s": "x"}, True),
    ("s", "ne", "x", {}, False),  # missing: false for every operator, ne included
    ("s", "ne", "x", {"s": None}, False),  # JSON null, too
    ("s", "not_like", "x", {}, False),
    ("a.b", "eq", 1, {"a": {"b": 1}}, True),  # dot paths into metadata
    ("a.b", "eq", 1, {"a": [1]}, False),
    ("_llm.total_tokens", "gt", 10, {"_llm": {"total_tokens": 11}}, True),
    ("s", "like", "%", {"s": "100%"}, True),  # LIKE is escaped: % is literal
    ("s", "like", "_", {"s": "ab"}, False),
    ("name", "eq", "api_call", {}, True),
    ("name", "eq", 5, {}, False),  # a column needs a value of its type
    ("name", "like", "call", {}, True),
    ("source", "eq", "user", {}, True),
]


@pytest.mark.parametrize(("prop", "op", "value", "metadata", "expected"), AGREEMENTS)
def test_sql_and_python_agree(
    prop: str, op: str, value: Any, metadata: dict[str, Any], expected: bool
) -> None:
    event = make_event(**metadata)
    assert sql_matches(one_clause(prop, op, value), event) is expected
    assert python_matches(one_clause(prop, op, value), event) is expected


def test_conjunctions() -> None:
    event = make_event(a=1, b=2)
    yes, no = Clause("a", "eq", 1), Clause("b", "eq", 1)
    missing = Clause("zz", "eq", 1)  # NULL in SQL
    assert sql_matches(Filter("and", ()), event)
    assert sql_matches(Filter("or", ()), event)  # empty `or` is true, as in Polar
    assert sql_matches(Filter("or", (no, yes)), event)
    assert not sql_matches(Filter("and", (yes, no)), event)
    assert sql_matches(Filter("or", (missing, yes)), event)  # NULL OR TRUE
    assert not sql_matches(Filter("or", (missing, no)), event)  # NULL OR FALSE
    assert sql_matches(Filter("and", (yes, Filter("or", (no, yes)))), event)


def test_aggregation_values() -> None:
    tokens = Aggregation("sum", "tokens")
    assert sql_value(Aggregation("count"), make_event()) == 1.0
    assert sql_value(tokens, make_event(tokens=3)) == 3.0
    assert sql_value(tokens, make_event(tokens=True)) is None
    assert sql_value(tokens, make_event(tokens="3")) is None
    assert sql_value(tokens, make_event()) is None
    assert sql_value(Aggregation("sum", "name"), make_event()) is None
    events = [
        make_event(u="a"),
        make_event(u=1),
        make_event(u=1.0),
        make_event(u=None),
        make_event(),
    ]
    assert consumed(Filter("and", ()), Aggregation("unique", "u"), events) == 3.0


def test_jsonb_text() -> None:
    assert jsonb_text(True) == "true"
    assert jsonb_text(1.5) == "1.5"
    assert jsonb_text(1e20) == "100000000000000000000"
    assert jsonb_text({"bb": 1, "a": [1, 2]}) == '{"a": [1, 2], "bb": 1}'
