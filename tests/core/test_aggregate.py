"""Count, sum, min and max of a set of events (``outpost_core._aggregate``)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outpost_core import Aggregate
from outpost_core._aggregate import EMPTY, format_number

finite = st.floats(allow_nan=False, allow_infinity=False)
small = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False)


def test_empty_aggregate_has_no_min_or_max() -> None:
    assert Aggregate() == EMPTY == Aggregate.of([])
    assert (EMPTY.count, EMPTY.sum, EMPTY.min, EMPTY.max) == (0, 0.0, None, None)


def test_add_tracks_count_sum_min_and_max() -> None:
    agg = EMPTY.add(3.0)
    assert agg == Aggregate(count=1, sum=3.0, min=3.0, max=3.0)
    agg = agg.add(-2.5).add(10.0)
    assert agg == Aggregate(count=3, sum=10.5, min=-2.5, max=10.0)
    assert Aggregate() == EMPTY  # add returns a new value; frozen


def test_of_is_add_in_order() -> None:
    assert Aggregate.of([1.0, 5.0, 2.0]) == Aggregate(count=3, sum=8.0, min=1.0, max=5.0)


def test_merge_with_empty_on_either_side_is_the_other() -> None:
    agg = Aggregate.of([1.0, 2.0])
    assert agg.merge(EMPTY) is agg
    assert EMPTY.merge(agg) is agg
    assert EMPTY.merge(EMPTY) == EMPTY


def test_merge_combines_both_sets() -> None:
    left = Aggregate.of([1.0, 7.0])
    right = Aggregate.of([-3.0, 4.0, 4.0])
    assert left.merge(right) == Aggregate(count=5, sum=13.0, min=-3.0, max=7.0)
    assert right.merge(left) == left.merge(right)


@given(st.lists(small, max_size=20), st.lists(small, max_size=20))
def test_merge_equals_the_aggregate_of_the_union(xs: list[float], ys: list[float]) -> None:
    merged = Aggregate.of(xs).merge(Aggregate.of(ys))
    union = Aggregate.of(xs + ys)
    assert (merged.count, merged.min, merged.max) == (union.count, union.min, union.max)
    assert math.isclose(merged.sum, union.sum, rel_tol=1e-9, abs_tol=1e-3)


@pytest.mark.parametrize(
    ("func", "expected"),
    [("count", 4.0), ("sum", 10.0), ("avg", 2.5), ("min", -1.0), ("max", 6.0)],
)
def test_quantity_for_every_bucketed_func(func: str, expected: float) -> None:
    agg = Aggregate.of([-1.0, 6.0, 2.0, 3.0])
    assert agg.quantity(func) == expected
    assert isinstance(agg.quantity(func), float)


@pytest.mark.parametrize("func", ["count", "sum", "avg", "min", "max"])
def test_quantity_of_the_empty_set_is_zero(func: str) -> None:
    assert EMPTY.quantity(func) == 0.0


def test_quantity_refuses_unique_and_unknown_funcs() -> None:
    for func in ("unique", "median", ""):
        with pytest.raises(ValueError, match="no bucketed quantity"):
            EMPTY.quantity(func)


@pytest.mark.parametrize(
    ("agg", "text"),
    [
        (EMPTY, "0 0 - -"),
        (Aggregate.of([1.0]), "1 1 1 1"),
        (Aggregate.of([1.5, -2.0]), "2 -0.5 -2 1.5"),
        (Aggregate.of([0.1, 0.2]), "2 0.30000000000000004 0.1 0.2"),
        (Aggregate.of([1e300]), "1 1e+300 1e+300 1e+300"),
    ],
)
def test_encode_is_the_redis_form(agg: Aggregate, text: str) -> None:
    assert agg.encode() == text
    assert Aggregate.decode(text) == agg


@given(st.lists(finite, max_size=10))
def test_encode_decode_round_trips(values: list[float]) -> None:
    agg = Aggregate.of(values)
    if not math.isfinite(agg.sum):
        return  # an overflowing sum is not a state the scripts can write
    decoded = Aggregate.decode(agg.encode())
    assert decoded == agg


@given(st.integers(min_value=0, max_value=2**40), finite, finite, finite)
def test_decode_of_encode_is_exact_for_any_finite_fields(
    count: int, total: float, a: float, b: float
) -> None:
    lo, hi = min(a, b), max(a, b)
    agg = Aggregate(count=count, sum=total, min=lo, max=hi) if count else Aggregate(sum=0.0)
    assert Aggregate.decode(agg.encode()) == agg


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1 2 3",
        "1 2 3 4 5",
        "1  2 3 4",
        "x 1 1 1",
        "1.5 1 1 1",
        "1 x 1 1",
        "1 1 x 1",
        "1 1 1 x",
        "-1 0 - -",
        "0 0 1 -",
        "0 0 - 1",
        "0 0 1 1",
        "1 1 - 1",
        "1 1 1 -",
        "1 1 - -",
        "1 nan 1 1",
        "1 inf 1 1",
        "1 1 -inf 1",
        "1 1 1 1e999",
        "1 1 nan 1",
    ],
)
def test_decode_rejects_malformed_text(text: str) -> None:
    assert Aggregate.decode(text) is None


@pytest.mark.parametrize("text", ["0 5 - -", "2 3 5 1"])
def test_decode_rejects_what_from_wire_rejects(text: str) -> None:
    assert Aggregate.decode(text) is None


@pytest.mark.parametrize("text", ["1_0 10 1 1", "1 1_0.5 1 1", "\u0661 1 1 1"])
def test_decode_rejects_number_forms_lua_refuses(text: str) -> None:
    assert Aggregate.decode(text) is None


@pytest.mark.parametrize(
    ("obj", "agg"),
    [
        ({"count": 0, "sum": 0, "min": None, "max": None}, EMPTY),
        ({"count": 0, "sum": 0.0}, EMPTY),
        ({"count": 2, "sum": 3, "min": 1, "max": 2}, Aggregate(count=2, sum=3.0, min=1.0, max=2.0)),
        (
            {"count": 1, "sum": 2.5, "min": 2.5, "max": 2.5},
            Aggregate(count=1, sum=2.5, min=2.5, max=2.5),
        ),
    ],
)
def test_from_wire_accepts_polars_json(obj: object, agg: Aggregate) -> None:
    parsed = Aggregate.from_wire(obj)
    assert parsed == agg
    assert parsed is not None
    assert all(type(x) is float for x in (parsed.sum, parsed.min, parsed.max) if x is not None)


@pytest.mark.parametrize(
    "obj",
    [
        None,
        [],
        "0 0 - -",
        {},
        {"count": "1", "sum": 1, "min": 1, "max": 1},
        {"count": 1.0, "sum": 1, "min": 1, "max": 1},
        {"count": True, "sum": 1, "min": 1, "max": 1},
        {"count": 1, "sum": "1", "min": 1, "max": 1},
        {"count": 1, "sum": True, "min": 1, "max": 1},
        {"count": 1, "sum": math.nan, "min": 1, "max": 1},
        {"count": 1, "sum": math.inf, "min": 1, "max": 1},
        {"count": -1, "sum": 0, "min": None, "max": None},
        {"count": 0, "sum": 1, "min": None, "max": None},
        {"count": 0, "sum": 0, "min": 0, "max": None},
        {"count": 0, "sum": 0, "min": None, "max": 0},
        {"count": 1, "sum": 1, "min": None, "max": 1},
        {"count": 1, "sum": 1, "min": 1, "max": None},
        {"count": 1, "sum": 1, "min": False, "max": 1},
        {"count": 1, "sum": 1, "min": 1, "max": math.inf},
        {"count": 2, "sum": 3, "min": 2, "max": 1},
    ],
)
def test_from_wire_rejects_malformed_json(obj: object) -> None:
    assert Aggregate.from_wire(obj) is None


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (-0.0, "0"),
        (1.0, "1"),
        (-7.0, "-7"),
        (0.5, "0.5"),
        (0.1, "0.1"),
        (1 / 3, "0.3333333333333333"),
        (2.0**53 - 1, "9007199254740991"),
        (1e300, "1e+300"),
        (5e-324, "4.94065645841247e-324"),  # %.15g reads back exactly: Lua's fmt stops there
    ],
)
def test_format_number_is_short_and_integral_values_have_no_point(value: float, text: str) -> None:
    assert format_number(value) == text
    assert float(text) == value


def _lua_fmt(value: float) -> str:
    """lib.lua's fmt, transcribed: what the scripts write."""
    if value == math.floor(value) and abs(value) < 2**53:
        return str(int(value))
    for digits in (15, 16):
        if float(format(value, f".{digits}g")) == value:
            return format(value, f".{digits}g")
    return format(value, ".17g")


@given(finite)
def test_format_number_writes_what_the_scripts_write(value: float) -> None:
    text = format_number(value)
    assert float(text) == value
    assert text == _lua_fmt(value)
    if value.is_integer() and abs(value) < 2**53:
        assert "." not in text and "e" not in text


def test_format_number_of_two_to_the_53() -> None:
    assert format_number(2.0**53) == "9007199254740992"


def test_encode_of_an_aggregate_of_ints() -> None:
    assert Aggregate.of([3]).encode() == "1 3 3 3"
