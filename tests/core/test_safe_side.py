"""Counting on the safe side: an event counts locally if Polar's Python matching or its
SQL matching counts it, with the larger of the two values (``Configuration.contributions``).

Each row of docs/emulator.md's table "Polar's SQL matching against its Python matching" is a case
below, then the cases where both dialects agree, then why the OR applies to the whole filter.
The events go through ``build_event`` and ``view()``, exactly as ``track()`` builds them.
"""

from __future__ import annotations

from typing import Any

import pytest

from outpost_core import Customer, parse_configuration
from outpost_core._configuration import safe_value
from outpost_core._event import build_event
from outpost_core._filters import Aggregation, EventView
from outpost_core._sql_filters import sql_value
from tests.core._payloads import configuration, reducer

SECOND_US = 1_000_000
T_S = 1_796_223_720  # 15:02:00 on the emulator's example day
COST = {"amount": 1, "currency": "usd"}
LLM = {"vendor": "v", "model": "m", "input_tokens": 1, "output_tokens": 2, "total_tokens": 30}


def view(metadata: dict[str, Any] | None = None, *, fraction_us: int = 0) -> EventView:
    tracked = build_event(
        event_id="e1",
        name="api_call",
        customer=Customer("external", "c1"),
        metadata=metadata,
        timestamp_us=T_S * SECOND_US + fraction_us,
    )
    return tracked.view()


def clause(prop: str, op: str, value: Any) -> dict[str, Any]:
    return {"property": prop, "operator": op, "value": value}


def counted(filter_clauses: list[dict[str, Any]], event: EventView, **options: Any) -> bool:
    """Whether a count reducer with these clauses counts the event locally."""
    parsed = parse_configuration(
        configuration(reducer("r", ["m"], clauses=filter_clauses, **options))
    )
    return parsed.contributions(event) == [("r", 1.0)]


# The rows of the table where SQL (billing) counts and Python does not: counted before this change
# by neither the core nor its Lua scripts, so the local balance read above Polar's.
SQL_ONLY = [
    pytest.param(clause("n", "eq", 3), {"n": "3"}, 0, id="string-equals-number"),
    pytest.param(clause("n", "gt", 1), {"n": "2"}, 0, id="numeric-string-gt-number"),
    pytest.param(clause("s", "gt", 5), {"s": "abc"}, 0, id="text-order-against-number"),
    pytest.param(clause("s", "eq", True), {"s": "t"}, 0, id="bool-value-as-t-against-string"),
    pytest.param(clause("s", "lt", True), {"s": "a"}, 0, id="bool-value-as-t-orders-strings"),
    pytest.param(clause("b", "like", "tr"), {"b": True}, 0, id="like-on-json-true"),
    pytest.param(clause("f", "like", "000"), {"f": 1e20}, 0, id="like-on-plain-float-text"),
    pytest.param(clause("_cost", "like", '"usd"'), {"_cost": COST}, 0, id="like-on-json-object"),
    pytest.param(clause("s", "like", True), {"s": "total"}, 0, id="like-bool-value-as-t"),
    pytest.param(clause("timestamp", "eq", T_S + 1), {}, 600_000, id="timestamp-rounds"),
    pytest.param(clause("timestamp", "like", T_S + 1), {}, 500_000, id="timestamp-like-rounds"),
    pytest.param(clause("timestamp", "not_like", False), {}, 0, id="timestamp-not-like-bool"),
]

# The rows where Python (Polar's real-time rollup) counts and SQL does not: counted already.
PYTHON_ONLY = [
    pytest.param(clause("b", "eq", 1), {"b": True}, 0, id="true-equals-one"),
    pytest.param(clause("n", "ne", "x"), {"n": 3}, 0, id="number-ne-string"),
    pytest.param(clause("b", "ne", "x"), {"b": True}, 0, id="bool-ne-string"),
    pytest.param(clause("_cost", "ne", "x"), {"_cost": COST}, 0, id="object-ne-string"),
    pytest.param(clause("timestamp", "eq", T_S), {}, 600_000, id="timestamp-truncates"),
    pytest.param(clause("timestamp", "gt", True), {}, 0, id="timestamp-gt-bool"),  # Postgres fails
]


@pytest.mark.parametrize(("filter_clause", "metadata", "fraction_us"), SQL_ONLY + PYTHON_ONLY)
def test_an_event_either_dialect_counts_is_counted(
    filter_clause: dict[str, Any], metadata: dict[str, Any], fraction_us: int
) -> None:
    assert counted([filter_clause], view(metadata, fraction_us=fraction_us))


@pytest.mark.parametrize(
    ("filter_clause", "metadata", "expected"),
    [
        # A missing key or a JSON null fails every operator in both, `ne` included.
        (clause("missing", "ne", "x"), {}, False),
        (clause("missing", "not_like", "x"), {}, False),
        (clause("_llm.prompt", "ne", "x"), {"_llm": {**LLM, "prompt": None}}, False),
        # Dot paths reach into nested metadata.
        (clause("_llm.total_tokens", "gte", 30), {"_llm": LLM}, True),
        (clause("_llm.vendor", "eq", "v"), {"_llm": LLM}, True),
        # `like` is a substring test.
        (clause("s", "like", "a%c"), {"s": "xa%cx"}, True),
        (clause("s", "like", "b"), {"s": "abc"}, True),
        (clause("s", "not_like", "zz"), {"s": "abc"}, True),
        (clause("s", "not_like", "b"), {"s": "abc"}, False),
        # A column needs a value of its type.
        (clause("name", "eq", 1), {}, False),
        (clause("source", "eq", True), {}, False),
        (clause("timestamp", "gt", "1"), {}, False),
        (clause("name", "like", "pi_c"), {}, True),
        # A number compares with an int or a bool value as a number.
        (clause("n", "gt", 2), {"n": 2.5}, True),
        (clause("n", "eq", True), {"n": 1}, True),
        (clause("n", "lt", False), {"n": 0.5}, False),
        # Plain strings, and booleans against booleans.
        (clause("s", "eq", "abc"), {"s": "abc"}, True),
        (clause("s", "gt", "abd"), {"s": "abc"}, False),
        (clause("b", "eq", True), {"b": True}, True),
        (clause("b", "gt", False), {"b": True}, True),
        (clause("b", "eq", False), {"b": True}, False),
    ],
)  # fmt: skip
def test_where_both_dialects_agree(
    filter_clause: dict[str, Any], metadata: dict[str, Any], expected: bool
) -> None:
    assert counted([filter_clause], view(metadata)) is expected


@pytest.mark.parametrize(
    ("filter_clause", "metadata"),
    [
        # Under Polar's unescaped `LIKE '%v%'` these hold; escaped (the emulator) they do not.
        (clause("s", "like", "a%c"), {"s": "abbbc"}),
        (clause("s", "like", "a_c"), {"s": "abc"}),
        (clause("s", "not_like", "a%c"), {"s": "abc"}),  # escaped: "a%c" is not in "abc"
        (clause("s", "not_like", "a\\b"), {"s": "a\\b"}),  # unescaped: "\\b" is "b", no "ab"
    ],
)
def test_like_counts_under_either_reading_of_polars_escaping(
    filter_clause: dict[str, Any], metadata: dict[str, Any]
) -> None:
    assert counted([filter_clause], view(metadata))


@pytest.mark.parametrize("conjunction", ["and", "or"])
def test_an_empty_filter_counts_everything(conjunction: str) -> None:
    assert counted([], view(), conjunction=conjunction)


SQL_YES = clause("n", "gt", 1)  # {"n": "2"}: SQL true, Python false
PY_YES = clause("b", "eq", 1)  # {"b": True}: Python true, SQL false
BOTH = {"n": "2", "b": True}


def test_the_or_applies_to_the_whole_filter_not_to_each_clause() -> None:
    # Neither Polar side counts this event: SQL fails the second clause, Python the first. An OR
    # per clause would count it; the whole-filter OR does not, since no side ever will.
    assert not counted([SQL_YES, PY_YES], view(BOTH))
    assert counted([SQL_YES, PY_YES], view(BOTH), conjunction="or")
    assert counted([SQL_YES, clause("name", "eq", "api_call")], view(BOTH))
    assert counted([PY_YES, clause("name", "eq", "api_call")], view(BOTH))


def test_nested_groups_are_matched_whole_by_each_dialect() -> None:
    inner_and = {"conjunction": "and", "clauses": [SQL_YES, clause("name", "eq", "api_call")]}
    assert counted([inner_and, clause("source", "eq", "user")], view(BOTH))
    inner_or = {"conjunction": "or", "clauses": [PY_YES, clause("name", "eq", "other")]}
    assert counted([inner_or], view(BOTH))
    mixed = {"conjunction": "and", "clauses": [SQL_YES, PY_YES]}
    assert not counted([mixed], view(BOTH), conjunction="or")
    # SQL's NULL (a missing key) inside an `or` does not spoil a true sibling ...
    assert counted(
        [{"conjunction": "or", "clauses": [clause("missing", "eq", 1), SQL_YES]}], view(BOTH)
    )
    # ... and fails an `and` like a false clause.
    assert not counted(
        [{"conjunction": "and", "clauses": [clause("missing", "eq", 1), SQL_YES]}], view(BOTH)
    )


def contributions(func: str, prop: str, event: EventView) -> list[tuple[str, float]]:
    parsed = parse_configuration(configuration(reducer("r", ["m"], func=func, prop=prop)))
    return parsed.contributions(event)


@pytest.mark.parametrize("func", ["sum", "max", "min", "avg"])
def test_a_timestamp_counts_its_rounded_seconds_when_sql_rounds_up(func: str) -> None:
    # SQL rounds 15:02:00.6 to T_S + 1, Python truncates to T_S: the larger keeps a sum, a max and
    # an avg at or above Polar's; for min nothing can (a pending event lowers it anyway).
    assert contributions(func, "timestamp", view(fraction_us=600_000)) == [("r", T_S + 1.0)]
    assert contributions(func, "timestamp", view(fraction_us=500_000)) == [("r", T_S + 1.0)]
    assert contributions(func, "timestamp", view(fraction_us=499_999)) == [("r", float(T_S))]
    assert contributions(func, "timestamp", view()) == [("r", float(T_S))]


@pytest.mark.parametrize(
    ("prop", "metadata", "expected"),
    [
        ("v", {"v": 7}, [("r", 7.0)]),
        ("v", {"v": -2.5}, [("r", -2.5)]),
        ("_cost.amount", {"_cost": COST}, [("r", 1.0)]),
        ("v", {"v": "7"}, []),  # a numeric string is no JSON number for SQL, no number for Python
        ("v", {"v": True}, []),  # a boolean neither
        ("v", {"v": "abc"}, []),
        ("v", {}, []),
        ("_cost", {"_cost": COST}, []),
    ],
)
def test_a_property_value_counts_only_as_a_json_number_in_both(
    prop: str, metadata: dict[str, Any], expected: list[tuple[str, float]]
) -> None:
    assert contributions("sum", prop, view(metadata)) == expected


def test_name_and_source_never_carry_a_value() -> None:
    assert contributions("max", "name", view()) == []
    assert contributions("sum", "source", view()) == []


@pytest.mark.parametrize("func", ["count", "sum", "max", "min", "avg"])
@pytest.mark.parametrize("prop", ["v", "timestamp", "name", "source", "_cost", "_cost.amount"])
@pytest.mark.parametrize(
    "metadata", [{}, {"v": 3}, {"v": 2.5}, {"v": "3"}, {"v": True}, {"_cost": COST}]
)
@pytest.mark.parametrize("fraction_us", [0, 499_999, 500_000])
def test_the_value_is_the_larger_of_the_two_dialects(
    func: str, prop: str, metadata: dict[str, Any], fraction_us: int
) -> None:
    event = view(metadata, fraction_us=fraction_us)
    aggregation = Aggregation(func, None if func == "count" else prop)
    both = [
        v for v in (aggregation.value_of(event), sql_value(aggregation, event)) if v is not None
    ]
    assert safe_value(aggregation, event) == (max(both) if both else None)
