"""Meter filters and aggregations with Polar's SQL semantics (``_sql_filters``)."""

from __future__ import annotations

from typing import Any

import pytest

from outpost_core._filters import Aggregation, Clause, EventView, Filter, parse_filter
from outpost_core._sql_filters import (
    clause_matches,
    jsonb_text,
    sql_epoch_seconds,
    sql_matches,
    sql_value,
)

T_S = 1_796_223_600
EVENT = EventView(
    name="api_call",
    timestamp_s=T_S,
    subsecond_us=600_000,
    metadata={
        "n": 12,
        "ratio": 0.5,
        "three": "3",
        "s": "abc",
        "pct": "xa%cb%yc%",
        "multiline": "a\nb",
        "t": "t",
        "flag": True,
        "off": False,
        "big": 1e20,
        "none": None,
        "_cost": {"amount": 1, "currency": "usd"},
        "list": [1, "a"],
    },
)
ALL_OPERATORS = ["eq", "ne", "gt", "gte", "lt", "lte", "like", "not_like"]


def single(prop: str, op: str, value: Any) -> Filter:
    return parse_filter(
        {"conjunction": "and", "clauses": [{"property": prop, "operator": op, "value": value}]}
    )


@pytest.mark.parametrize(
    ("prop", "op", "value", "expected"),
    [
        # The table of docs/emulator.md, SQL column.
        ("three", "eq", 3, True),
        ("s", "gt", 5, True),
        ("t", "eq", True, True),
        ("flag", "eq", 1, False),
        ("n", "ne", "x", False),
        ("flag", "ne", "x", False),
        ("_cost", "ne", "x", False),
        ("flag", "like", "tr", True),
        ("big", "like", "000", True),
        ("_cost", "like", '"usd"', True),
        ("s", "like", True, False),
        ("t", "like", True, True),
        ("timestamp", "eq", T_S + 1, True),
        ("timestamp", "eq", T_S, False),
        # Strings compare as text with str(value), a bool value as 't' / 'f'.
        ("three", "gt", 1, True),
        ("three", "lt", 10, False),  # "3" > "10" as text
        ("s", "eq", "abc", True),
        ("s", "ne", "abc", False),
        ("t", "ne", False, True),
        # Numbers compare as floats with an int or a bool value, never with a string.
        ("n", "gt", 11, True),
        ("n", "lte", 12, True),
        ("ratio", "lt", True, True),
        ("n", "eq", "12", False),
        # Booleans compare with a bool value only.
        ("flag", "eq", True, True),
        ("flag", "gt", False, True),
        ("off", "lt", True, True),
        ("off", "eq", 0, False),
        # like reads the ->> text; not_like is its negation (on a present value).
        ("n", "like", 2, True),
        ("n", "not_like", 2, False),
        ("off", "like", "fal", True),
        ("ratio", "like", "0.5", True),
        # like / not_like hold under either reading of Polar's escaping (literal, or LIKE '%v%').
        ("s", "like", "a%c", True),  # unescaped: % is any run
        ("s", "like", "a_c", True),  # unescaped: _ is one character
        ("s", "like", "a__c", False),
        ("s", "like", "a%d", False),
        ("s", "not_like", "a%c", True),  # escaped: the text has no "a%c"
        ("s", "not_like", "b", False),
        ("pct", "like", "a%c", True),  # literal
        ("pct", "not_like", "a%c", False),
        ("pct", "like", "b\\%", True),  # unescaped: "\%" is a literal "%"
        ("s", "like", "b\\%", False),
        ("s", "like", "x\\", False),
        ("pct", "like", "c\\", True),  # a trailing backslash escapes the closing "%": ends in "%"
        ("pct", "like", "b\\", False),
        ("multiline", "like", "a_b", True),  # "_" matches a newline too
        ("multiline", "like", "a%b", True),
        ("list", "like", '[1, "a"]', True),
        # Missing, null, objects and arrays are NULL for every comparison.
        ("missing", "ne", "x", False),
        ("none", "ne", "x", False),
        ("none", "not_like", "x", False),
        ("list", "ne", 1, False),
        ("_cost.amount", "eq", 1, True),
        ("_cost.currency.x", "eq", "usd", False),
        # Columns need their type; timestamp rounds; like casts the column to text.
        ("name", "eq", "api_call", True),
        ("name", "gt", "api", True),
        ("name", "like", "pi_c", True),
        ("name", "eq", 1, False),
        ("source", "eq", "user", True),
        ("source", "not_like", "us", False),
        ("source", "eq", True, False),
        ("timestamp", "gte", T_S + 1, True),
        ("timestamp", "like", str(T_S + 1), False),
        ("timestamp", "like", T_S + 1, True),
        ("timestamp", "not_like", T_S + 1, False),
        ("timestamp", "gt", True, False),  # Postgres refuses bigint > boolean
        ("timestamp", "like", True, False),
        ("timestamp", "not_like", False, True),  # the text has no 'f'
    ],
)
def test_sql_clause(prop: str, op: str, value: Any, expected: bool) -> None:
    parsed = single(prop, op, value)
    assert isinstance(parsed.clauses[0], Clause)
    assert clause_matches(parsed.clauses[0], EVENT) is expected
    assert sql_matches(parsed, EVENT) is expected


@pytest.mark.parametrize("op", ALL_OPERATORS)
@pytest.mark.parametrize("value", ["x", 1, True])
def test_a_missing_key_is_null_for_every_operator(op: str, value: Any) -> None:
    assert sql_matches(single("nope", op, value), EVENT) is False


@pytest.mark.parametrize(
    ("subsecond_us", "seconds"),
    [(0, T_S), (499_999, T_S), (500_000, T_S + 1), (999_999, T_S + 1)],
)
def test_sql_rounds_the_timestamp_to_the_nearest_second(subsecond_us: int, seconds: int) -> None:
    event = EventView(name="x", timestamp_s=T_S, metadata={}, subsecond_us=subsecond_us)
    assert sql_epoch_seconds(event) == seconds
    assert sql_value(Aggregation("sum", "timestamp"), event) == float(seconds)


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        (Aggregation("count"), 1.0),
        (Aggregation("sum", "n"), 12.0),
        (Aggregation("max", "ratio"), 0.5),
        (Aggregation("min", "_cost.amount"), 1.0),
        (Aggregation("avg", "timestamp"), float(T_S + 1)),
        (Aggregation("sum", "three"), None),
        (Aggregation("sum", "flag"), None),
        (Aggregation("sum", "none"), None),
        (Aggregation("sum", "missing"), None),
        (Aggregation("sum", "_cost"), None),
        (Aggregation("sum", "name"), None),
        (Aggregation("max", "source"), None),
    ],
)
def test_sql_value(aggregation: Aggregation, expected: float | None) -> None:
    got = sql_value(aggregation, EVENT)
    assert got == expected
    assert got is None or type(got) is float


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain", "plain"),
        (True, "true"),
        (False, "false"),
        (12, "12"),
        (-3, "-3"),
        (0.5, "0.5"),
        (1.0, "1.0"),
        (1e20, "100000000000000000000"),
        (1.5e-7, "0.00000015"),
        (-0.0, "0.0"),
        (None, "null"),
        ({"currency": "usd", "amount": 1}, '{"amount": 1, "currency": "usd"}'),
        ({"bb": 1, "a": 2, "ab": 3}, '{"a": 2, "ab": 3, "bb": 1}'),
        # Same length in bytes, then bytewise: "zz" comes before "é" (0xc3 0xa9).
        ({"é": 'x\n"y"', "zz": None}, '{"zz": null, "é": "x\\n\\"y\\""}'),
        ([1, "a", [True]], '[1, "a", [true]]'),
        ({"n": {"f": 1e20}}, '{"n": {"f": 100000000000000000000}}'),
    ],
)
def test_jsonb_text(value: Any, text: str) -> None:
    assert jsonb_text(value) == text


def test_empty_groups_are_true_and_groups_nest() -> None:
    for conjunction in ("and", "or"):
        assert sql_matches(parse_filter({"conjunction": conjunction, "clauses": []}), EVENT)
    yes = {"property": "three", "operator": "eq", "value": 3}
    null = {"property": "missing", "operator": "eq", "value": 3}
    assert sql_matches(parse_filter({"conjunction": "or", "clauses": [null, yes]}), EVENT)
    assert not sql_matches(parse_filter({"conjunction": "and", "clauses": [null, yes]}), EVENT)
    nested = {"conjunction": "and", "clauses": [yes, {"conjunction": "or", "clauses": [yes]}]}
    assert sql_matches(parse_filter(nested), EVENT)
    assert not sql_matches(parse_filter({"conjunction": "or", "clauses": [null]}), EVENT)


def test_a_dotted_property_is_also_read_as_one_key() -> None:
    """Polar's filter SQL has been seen to read `a.b` as the key "a.b": either reading counts."""
    one_key = EventView(name="x", timestamp_s=0, metadata={"_cost.currency": "usd", "a.b": 4})
    path = EventView(name="x", timestamp_s=0, metadata={"a": {"b": 2}, "a.b": "x"})
    assert clause_matches(Clause("_cost.currency", "eq", "usd"), one_key)
    assert clause_matches(Clause("a.b", "gt", 3), one_key)
    assert not clause_matches(Clause("a.b", "gt", 5), one_key)
    assert clause_matches(Clause("a.b", "eq", 2), path)  # the one-key reading fails, the path holds
    assert sql_value(Aggregation("sum", "a.b"), one_key) == 4
    assert sql_value(Aggregation("sum", "a.b"), path) == 2
    both = EventView(name="x", timestamp_s=0, metadata={"a": {"b": 2}, "a.b": 7})
    assert sql_value(Aggregation("max", "a.b"), both) == 7
    assert sql_value(Aggregation("sum", "a.b"), EventView("x", 0, {})) is None


def test_the_safe_value_takes_either_reading() -> None:
    from outpost_core._configuration import safe_value

    one_key = EventView(name="x", timestamp_s=0, metadata={"a.b": 4})
    path = EventView(name="x", timestamp_s=0, metadata={"a": {"b": 2}})
    both = EventView(name="x", timestamp_s=0, metadata={"a": {"b": 9}, "a.b": 7})
    assert safe_value(Aggregation("sum", "a.b"), one_key) == 4
    assert safe_value(Aggregation("sum", "a.b"), path) == 2
    assert safe_value(Aggregation("sum", "a.b"), both) == 9
    assert safe_value(Aggregation("sum", "a.b"), EventView("x", 0, {})) is None
