"""Meter filters and aggregations with Polar's server-side Python semantics (``_filters``)."""

from __future__ import annotations

from typing import Any

import pytest

from outpost_core._filters import (
    ALL_FUNCS,
    BUCKETED_FUNCS,
    COLUMNS,
    OPERATORS,
    Aggregation,
    Clause,
    EventView,
    Filter,
    InvalidDefinition,
    lookup,
    parse_aggregation,
    parse_filter,
)

EVENT = EventView(
    name="api_call",
    timestamp_s=1_796_223_600,
    metadata={
        "tokens": 12,
        "ratio": 0.5,
        "flag": True,
        "off": False,
        "model": "gpt-4o",
        "three": "3",
        "none": None,
        "_llm": {"total_tokens": 30, "vendor": "openai", "deep": {"x": 1}},
        "dotted.key": 5,
    },
)
ALL_OPERATORS = ["eq", "ne", "gt", "gte", "lt", "lte", "like", "not_like"]


def clause(prop: object, op: object, value: Any) -> dict[str, Any]:
    return {"property": prop, "operator": op, "value": value}


def matches(prop: str, op: str, value: Any, event: EventView = EVENT) -> bool:
    return parse_filter({"conjunction": "and", "clauses": [clause(prop, op, value)]}).matches(event)


def test_constants() -> None:
    assert set(OPERATORS) == {"eq", "ne", "gt", "gte", "lt", "lte"}
    assert COLUMNS == ("name", "source", "timestamp")
    assert BUCKETED_FUNCS == ("count", "sum", "avg", "min", "max")
    assert (*BUCKETED_FUNCS, "unique") == ALL_FUNCS


@pytest.mark.parametrize("conjunction", ["and", "or"])
def test_empty_and_and_empty_or_both_match(conjunction: str) -> None:
    assert parse_filter({"conjunction": conjunction, "clauses": []}).matches(EVENT)


def test_and_needs_all_or_needs_one() -> None:
    yes, no = clause("name", "eq", "api_call"), clause("name", "eq", "other")
    assert parse_filter({"conjunction": "and", "clauses": [yes, yes]}).matches(EVENT)
    assert not parse_filter({"conjunction": "and", "clauses": [yes, no]}).matches(EVENT)
    assert parse_filter({"conjunction": "or", "clauses": [no, yes]}).matches(EVENT)
    assert not parse_filter({"conjunction": "or", "clauses": [no, no]}).matches(EVENT)


def test_nested_filters() -> None:
    inner_or = {
        "conjunction": "or",
        "clauses": [clause("tokens", "gt", 100), clause("model", "like", "gpt")],
    }
    outer = {"conjunction": "and", "clauses": [clause("name", "eq", "api_call"), inner_or]}
    parsed = parse_filter(outer)
    assert isinstance(parsed.clauses[1], Filter)
    assert parsed.matches(EVENT)
    other = EventView(name="api_call", timestamp_s=0, metadata={"model": "claude", "tokens": 1})
    assert not parsed.matches(other)


@pytest.mark.parametrize(
    ("prop", "op", "value", "expected"),
    [
        ("name", "eq", "api_call", True),
        ("name", "ne", "api_call", False),
        ("name", "ne", "other", True),
        ("name", "gt", "api", True),
        ("name", "lt", "api", False),
        ("name", "like", "pi_c", True),
        ("name", "not_like", "pi_c", False),
        ("name", "not_like", "zzz", True),
        ("source", "eq", "user", True),
        ("source", "ne", "system", True),
        ("source", "like", "se", True),
    ],
)
def test_name_and_source_compare_with_strings(
    prop: str, op: str, value: str, expected: bool
) -> None:
    assert matches(prop, op, value) is expected


@pytest.mark.parametrize("prop", ["name", "source"])
@pytest.mark.parametrize("op", ALL_OPERATORS)
@pytest.mark.parametrize("value", [1, 0, True, False])
def test_name_and_source_never_match_a_non_string(prop: str, op: str, value: Any) -> None:
    assert matches(prop, op, value) is False


def test_source_is_the_events_source() -> None:
    system = EventView(name="x", timestamp_s=0, metadata={}, source="system")
    assert matches("source", "eq", "system", system)
    assert not matches("source", "eq", "user", system)
    assert EVENT.source == "user"


@pytest.mark.parametrize(
    ("op", "value", "expected"),
    [
        ("eq", 1_796_223_600, True),
        ("ne", 1_796_223_600, False),
        ("gt", 1_796_223_599, True),
        ("gte", 1_796_223_600, True),
        ("lt", 1_796_223_600, False),
        ("lte", 1_796_223_600, True),
        ("like", 17962, True),
        ("not_like", 17962, False),
    ],
)
def test_timestamp_compares_with_integer_seconds(op: str, value: int, expected: bool) -> None:
    assert matches("timestamp", op, value) is expected


@pytest.mark.parametrize("op", ALL_OPERATORS)
def test_timestamp_never_matches_a_string(op: str) -> None:
    assert matches("timestamp", op, "1796223600") is False


@pytest.mark.parametrize(
    ("op", "value", "expected"),
    [
        ("gt", True, True),  # Polar's isinstance(True, int) holds: the value is 1
        ("eq", True, False),
        ("lt", False, False),
        ("ne", False, True),
        ("like", True, False),  # str(True) is "True"
        ("not_like", False, True),
    ],
)
def test_timestamp_takes_a_bool_as_polars_python_does(op: str, value: bool, expected: bool) -> None:
    assert matches("timestamp", op, value) is expected


@pytest.mark.parametrize("op", ALL_OPERATORS)
@pytest.mark.parametrize("prop", ["missing", "none", "_llm.missing", "tokens.deeper", "_llm.x.y"])
@pytest.mark.parametrize("value", ["x", 1, True])
def test_missing_or_null_metadata_matches_no_operator_not_even_ne(
    op: str, prop: str, value: Any
) -> None:
    assert matches(prop, op, value) is False


@pytest.mark.parametrize(
    ("prop", "op", "value", "expected"),
    [
        # True == 1 in Python, so a boolean metadata value equals the integer 1.
        ("flag", "eq", 1, True),
        ("flag", "ne", 1, False),
        ("flag", "gt", 0, True),
        ("off", "eq", 0, True),
        ("tokens", "eq", True, False),
        ("flag", "eq", True, True),
        # "3" and 3 are different, and ordering them is a TypeError, which does not match.
        ("three", "eq", 3, False),
        ("three", "ne", 3, True),
        ("three", "gt", 1, False),
        ("three", "lte", 1, False),
        ("three", "eq", "3", True),
        ("tokens", "eq", "12", False),
        ("tokens", "ne", "12", True),
        ("tokens", "gt", "1", False),
        ("tokens", "lt", "100", False),
        # Numbers compare across int and float.
        ("tokens", "gt", 11, True),
        ("tokens", "gte", 12, True),
        ("tokens", "lt", 12, False),
        ("tokens", "lte", 12, True),
        ("ratio", "lt", 1, True),
        ("ratio", "gt", 0, True),
        # Strings compare lexicographically.
        ("model", "gt", "claude", True),
        ("model", "lt", "claude", False),
        # A dict compares equal to nothing here, and refuses ordering.
        ("_llm", "eq", "x", False),
        ("_llm", "ne", "x", True),
        ("_llm", "gt", 1, False),
    ],
)
def test_metadata_comparisons_are_pythons_operators(
    prop: str, op: str, value: Any, expected: bool
) -> None:
    assert matches(prop, op, value) is expected


@pytest.mark.parametrize(
    ("prop", "op", "value", "expected"),
    [
        ("model", "like", "pt-4", True),
        ("model", "like", "claude", False),
        ("model", "not_like", "claude", True),
        ("model", "not_like", "gpt", False),
        ("tokens", "like", 2, True),  # str(2) in str(12)
        ("tokens", "like", "1", True),
        ("tokens", "like", 3, False),
        ("flag", "like", "ru", True),  # str(True) == "True"
        ("flag", "like", True, True),
        ("off", "like", "alse", True),
        ("ratio", "like", "0.5", True),
        ("model", "like", "", True),
        ("model", "not_like", "", False),
        ("_llm", "like", "openai", True),  # str() of a dict holds its values
    ],
)
def test_like_is_substring_of_str(prop: str, op: str, value: Any, expected: bool) -> None:
    assert matches(prop, op, value) is expected


def test_dot_paths_follow_nested_metadata() -> None:
    assert matches("_llm.total_tokens", "eq", 30)
    assert matches("_llm.vendor", "eq", "openai")
    assert matches("_llm.deep.x", "gte", 1)
    # A key that itself holds a dot is not reachable: the path splits on every dot.
    assert not matches("dotted.key", "eq", 5)


def test_lookup() -> None:
    assert lookup(EVENT.metadata, "tokens") == 12
    assert lookup(EVENT.metadata, "_llm.deep.x") == 1
    assert lookup(EVENT.metadata, "_llm.deep") == {"x": 1}
    assert lookup(EVENT.metadata, "none") is None
    assert lookup(EVENT.metadata, "missing") is None
    assert lookup(EVENT.metadata, "tokens.x") is None
    assert lookup({}, "") is None
    assert lookup({"": 1}, "") == 1


@pytest.mark.parametrize("prefixed", ["metadata.tokens", "metadata._llm.total_tokens"])
def test_metadata_prefix_is_stripped(prefixed: str) -> None:
    parsed = parse_filter({"conjunction": "and", "clauses": [clause(prefixed, "gt", 1)]})
    only = parsed.clauses[0]
    assert isinstance(only, Clause)
    assert only.property == prefixed.removeprefix("metadata.")
    assert parsed.matches(EVENT)
    assert parse_aggregation({"func": "sum", "property": prefixed}).property == only.property


def test_metadata_dot_name_becomes_the_name_column_as_in_polar() -> None:
    # Polar strips the prefix before matching too, so this reads the event's name.
    event = EventView(name="api_call", timestamp_s=0, metadata={"name": "other"})
    assert matches("metadata.name", "eq", "api_call", event)
    assert not matches("metadata.name", "eq", "other", event)


def test_parse_filter_builds_frozen_values() -> None:
    parsed = parse_filter(
        {"conjunction": "or", "clauses": [clause("name", "eq", "a"), clause("x", "like", 3)]}
    )
    assert parsed == Filter(
        conjunction="or",
        clauses=(Clause("name", "eq", "a"), Clause("x", "like", 3)),
    )
    assert hash(parsed) == hash(parse_filter(parsed_json(parsed)))


def parsed_json(parsed: Filter) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for item in parsed.clauses:
        assert isinstance(item, Clause)
        out.append(clause(item.property, item.operator, item.value))
    return {"conjunction": parsed.conjunction, "clauses": out}


@pytest.mark.parametrize(
    "value",
    ["", "x" * 1000, 2**31 - 1, -(2**31), 0, True, False],
)
def test_parse_filter_accepts_polars_value_types(value: Any) -> None:
    parsed = parse_filter({"conjunction": "and", "clauses": [clause("p", "eq", value)]})
    only = parsed.clauses[0]
    assert isinstance(only, Clause)
    assert only.value == value
    assert type(only.value) is type(value)


@pytest.mark.parametrize("op", ALL_OPERATORS)
def test_parse_filter_accepts_every_operator(op: str) -> None:
    parsed = parse_filter({"conjunction": "and", "clauses": [clause("p", op, 1)]})
    assert parsed.clauses == (Clause("p", op, 1),)


def nested(levels: int) -> dict[str, Any]:
    obj: dict[str, Any] = {"conjunction": "and", "clauses": [clause("name", "eq", "api_call")]}
    for _ in range(levels - 1):
        obj = {"conjunction": "and", "clauses": [obj]}
    return obj


def test_filters_nest_to_33_levels_and_no_deeper() -> None:
    assert parse_filter(nested(33)).matches(EVENT)
    with pytest.raises(InvalidDefinition, match="nested more than 32"):
        parse_filter(nested(34))


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (None, "must be an object"),
        ([], "must be an object"),
        ({"clauses": []}, "unknown conjunction"),
        ({"conjunction": "xor", "clauses": []}, "unknown conjunction"),
        ({"conjunction": "AND", "clauses": []}, "unknown conjunction"),
        ({"conjunction": "and"}, "clauses must be a list"),
        ({"conjunction": "and", "clauses": {}}, "clauses must be a list"),
        ({"conjunction": "and", "clauses": ["x"]}, "clause must be an object"),
        ({"conjunction": "and", "clauses": [{"operator": "eq", "value": 1}]}, "needs a property"),
        ({"conjunction": "and", "clauses": [clause("", "eq", 1)]}, "needs a property"),
        ({"conjunction": "and", "clauses": [clause(3, "eq", 1)]}, "needs a property"),
        ({"conjunction": "and", "clauses": [clause("p", "in", 1)]}, "unknown operator"),
        ({"conjunction": "and", "clauses": [clause("p", "EQ", 1)]}, "unknown operator"),
        ({"conjunction": "and", "clauses": [clause("p", None, 1)]}, "unknown operator"),
        ({"conjunction": "and", "clauses": [clause("p", ["eq"], 1)]}, "unknown operator"),
        ({"conjunction": "and", "clauses": [clause("p", {"eq": 1}, 1)]}, "unknown operator"),
        ({"conjunction": "and", "clauses": [clause("p", "eq", "x" * 1001)]}, "1000"),
        ({"conjunction": "and", "clauses": [clause("p", "eq", 2**31)]}, "32 bits"),
        ({"conjunction": "and", "clauses": [clause("p", "eq", -(2**31) - 1)]}, "32 bits"),
        ({"conjunction": "and", "clauses": [clause("p", "eq", 1.5)]}, "a string, a 32-bit"),
        ({"conjunction": "and", "clauses": [clause("p", "eq", 1.0)]}, "a string, a 32-bit"),
        ({"conjunction": "and", "clauses": [clause("p", "eq", None)]}, "a string, a 32-bit"),
        ({"conjunction": "and", "clauses": [clause("p", "eq", [1])]}, "a string, a 32-bit"),
        ({"conjunction": "and", "clauses": [{"conjunction": "nor", "clauses": []}]}, "unknown"),
    ],
)
def test_parse_filter_refuses_what_polars_schema_refuses(obj: object, message: str) -> None:
    with pytest.raises(InvalidDefinition, match=message):
        parse_filter(obj)


def test_invalid_definition_is_a_value_error() -> None:
    assert issubclass(InvalidDefinition, ValueError)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"func": "count"}, Aggregation("count")),
        ({"func": "count", "property": "ignored"}, Aggregation("count")),
        ({"func": "sum", "property": "tokens"}, Aggregation("sum", "tokens")),
        ({"func": "avg", "property": "t"}, Aggregation("avg", "t")),
        ({"func": "min", "property": "t"}, Aggregation("min", "t")),
        ({"func": "max", "property": "metadata.t"}, Aggregation("max", "t")),
        ({"func": "unique", "property": "user"}, Aggregation("unique", "user")),
    ],
)
def test_parse_aggregation_accepts(obj: object, expected: Aggregation) -> None:
    assert parse_aggregation(obj) == expected


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (None, "must be an object"),
        ("count", "must be an object"),
        ({}, "unknown aggregation"),
        ({"func": "median", "property": "x"}, "unknown aggregation"),
        ({"func": "SUM", "property": "x"}, "unknown aggregation"),
        ({"func": "sum"}, "needs a property"),
        ({"func": "max", "property": ""}, "needs a property"),
        ({"func": "unique", "property": 3}, "needs a property"),
    ],
)
def test_parse_aggregation_refuses(obj: object, message: str) -> None:
    with pytest.raises(InvalidDefinition, match=message):
        parse_aggregation(obj)


@pytest.mark.parametrize(
    ("func", "bucketed"),
    [
        ("count", True),
        ("sum", True),
        ("avg", True),
        ("min", True),
        ("max", True),
        ("unique", False),
    ],
)
def test_bucketed(func: str, bucketed: bool) -> None:
    assert Aggregation(func, None if func == "count" else "x").bucketed() is bucketed


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        (Aggregation("count"), 1.0),
        (Aggregation("sum", "tokens"), 12.0),
        (Aggregation("max", "ratio"), 0.5),
        (Aggregation("avg", "_llm.total_tokens"), 30.0),
        (Aggregation("sum", "timestamp"), 1_796_223_600.0),
        (Aggregation("sum", "flag"), None),  # a bool is not a number here
        (Aggregation("sum", "off"), None),
        (Aggregation("sum", "three"), None),  # a numeric string is not a number either
        (Aggregation("sum", "none"), None),
        (Aggregation("sum", "missing"), None),
        (Aggregation("sum", "_llm"), None),
        (Aggregation("sum", "name"), None),
        (Aggregation("min", "source"), None),
    ],
)
def test_value_of(aggregation: Aggregation, expected: float | None) -> None:
    got = aggregation.value_of(EVENT)
    assert got == expected
    if got is not None:
        assert type(got) is float


def test_value_of_count_ignores_the_event() -> None:
    empty = EventView(name="x", timestamp_s=0, metadata={})
    assert Aggregation("count").value_of(empty) == 1.0
