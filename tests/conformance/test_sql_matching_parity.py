"""The core's two dialects against the emulator's, on generated events and filters.

The core (``_filters``, ``_sql_filters``) and the emulator (``_matching``) are written apart and
import nothing from each other; this checks they agree clause by clause, and that what the core
counts locally (what either dialect counts) covers every event the emulator bills, with a value at
least as large.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from outpost_core import parse_configuration
from outpost_core._configuration import counts, safe_value
from outpost_core._filters import Aggregation as CoreAggregation
from outpost_core._filters import EventView, parse_filter
from outpost_core._sql_filters import sql_matches as core_sql_matches
from outpost_emulator._matching import python_matches, sql_matches, sql_value
from outpost_emulator._model import Aggregation, Clause, Filter, StoredEvent

T_S = 1_796_223_720
KEYS = ["n", "s", "b", "_cost"]
OPERATORS = ["eq", "ne", "gt", "gte", "lt", "lte", "like", "not_like"]

scalars = st.one_of(
    st.sampled_from(["3", "2", "10", "abc", "t", "f", "true", "total", "", "a%c", "ab%", "1e+20"]),
    st.integers(-5, 15),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0 or str(f) == "0.0"),
    st.sampled_from([1e20, 0.5, 2.0, 1.5e-7]),
    st.booleans(),
    st.none(),
)
costs = st.builds(
    lambda amount: {"amount": amount, "currency": "usd"}, st.integers(0, 9) | st.just(0.5)
)
metadata = st.fixed_dictionaries(
    {}, optional={"n": scalars, "s": scalars, "b": scalars, "_cost": costs}
)
values = st.one_of(
    st.sampled_from(["3", "1", "x", "t", "tr", "000", '"usd"', "", "a%c", "a_c", "b\\", "usd"]),
    st.integers(-3, 12),
    st.sampled_from([T_S, T_S + 1, 17962]),
    st.booleans(),
)
properties = st.sampled_from([*KEYS, "_cost.amount", "_cost.currency", "missing", "name",
                              "source", "timestamp"])  # fmt: skip
clauses = st.builds(Clause, properties, st.sampled_from(OPERATORS), values)
filters = st.recursive(
    st.builds(lambda c: Filter("and", (c,)), clauses),
    lambda inner: st.builds(
        lambda conj, items: Filter(conj, tuple(items)),
        st.sampled_from(["and", "or"]),
        st.lists(inner | clauses, max_size=3),
    ),
    max_leaves=6,
)
subseconds = st.sampled_from([0, 499_999, 500_000, 600_000, 999_999])


def both_events(meta: dict[str, Any], subsecond_us: int) -> tuple[StoredEvent, EventView]:
    at = T_S * 1_000_000 + subsecond_us
    stored = StoredEvent(
        seq=1,
        name="api_call",
        timestamp_us=at,
        identity=("external_customer_id", "c1"),
        external_id=None,
        metadata=meta,
        ingested_at_us=at,
    )
    view = EventView(name="api_call", timestamp_s=T_S, metadata=meta, subsecond_us=subsecond_us)
    return stored, view


def has_like_wildcards(filter_: Filter) -> bool:
    return any(
        has_like_wildcards(c)
        if isinstance(c, Filter)
        else isinstance(c.value, str) and any(w in c.value for w in ("%", "_", "\\"))
        for c in filter_.clauses
    )


@settings(max_examples=3000, deadline=None)
@given(filters, metadata, subseconds)
def test_the_core_matches_like_the_emulator_and_counts_what_it_bills(
    filter_: Filter, meta: dict[str, Any], subsecond_us: int
) -> None:
    stored, view = both_events(meta, subsecond_us)
    core_filter = parse_filter(filter_.to_json())
    billed = sql_matches(filter_, stored)
    mine = core_sql_matches(core_filter, view)
    if has_like_wildcards(filter_):
        # The emulator reads `like` as escaped; the core also holds under the unescaped reading.
        assert mine or not billed
    else:
        assert mine is billed
    assert core_filter.matches(view) is python_matches(filter_, stored)
    if billed:
        assert counts(core_filter, view)


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from(["count", "sum", "max", "min", "avg"]),
    st.sampled_from([*KEYS, "_cost.amount", "timestamp", "name"]),
    metadata,
    subseconds,
)
def test_the_core_value_is_never_below_the_billed_one(
    func: str, prop: str, meta: dict[str, Any], subsecond_us: int
) -> None:
    stored, view = both_events(meta, subsecond_us)
    aggregation = Aggregation(func, None if func == "count" else prop)  # type: ignore[arg-type]
    billed = sql_value(aggregation, stored)
    mine = safe_value(CoreAggregation(func, aggregation.property), view)
    assert (billed is None) is (mine is None)
    assert billed is None or mine is None or mine >= billed
    configured = parse_configuration(
        {"reducers": [{"id": "r", "meter_ids": ["m"], "aggregation": aggregation.to_json(),
                       "filter": {"conjunction": "and", "clauses": []}}]}
    )  # fmt: skip
    assert configured.contributions(view) == ([] if mine is None else [("r", mine)])
