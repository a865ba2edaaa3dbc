"""Polar's SQL meter matching, evaluated by PostgreSQL itself, against the core's and the
emulator's matchers.

Each clause becomes the SQL Polar's billing query runs over the events' JSONB metadata: a
column compared only with a value of its type (``timestamp`` as ``CAST(EXTRACT(epoch) AS
BIGINT)``, cast to text for ``like``); a metadata value through a CASE on ``jsonb_typeof`` (a
string compared as ``->>`` text with the value's text, booleans as ``t``/``f``; a number as
``CAST(->> AS FLOAT)`` with an int or bool value; a boolean as ``CAST(->> AS BOOLEAN)`` with a
bool value; anything else NULL); ``like`` as ``->> LIKE '%value%'`` with the value as it is.
A dotted property is read both ways Polar's code has been seen to: as a path
(``-> 'a' -> 'b'``) and as one key (``-> 'a.b'``).

An event PostgreSQL keeps and the core's local count leaves out would let Outpost under-count:
that fails here. So does any other disagreement, except the ones the core makes on purpose
(it also holds where the escaped reading of ``like`` does) and the emulator's documented
reading of ``like`` values with wildcards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outpost_core._configuration import counts, safe_value
from outpost_core._filters import Aggregation as CoreAggregation
from outpost_core._filters import parse_filter
from outpost_core._sql_filters import sql_matches as core_sql_matches
from outpost_emulator._matching import sql_matches, sql_value
from outpost_emulator._model import Aggregation, Clause, Filter
from tests.conformance.test_sql_matching_parity import (
    T_S,
    both_events,
    filters,
    has_like_wildcards,
    metadata,
    subseconds,
)
from tests.support.postgres import postgres_connection

psycopg = pytest.importorskip("psycopg", reason="psycopg (v3) is not installed")
from psycopg.types.json import Jsonb  # noqa: E402

COLUMNS = {"name", "source", "timestamp"}
EPOCH = "CAST(EXTRACT(epoch FROM ts) AS BIGINT)"
SQL_OPS = {"eq": "=", "ne": "<>", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


@pytest.fixture(scope="module")
def pg() -> Iterator[Any]:
    with postgres_connection() as connection:
        connection.execute(
            "CREATE TEMPORARY TABLE ev (id int PRIMARY KEY, name text, source text, "
            "ts timestamptz, user_metadata jsonb)"
        )
        yield connection


class Unsupported(Exception):
    """PostgreSQL would refuse this clause (the query fails and counts nothing)."""


def _bind(value: str | int | bool) -> tuple[str, list[Any]]:
    if isinstance(value, bool):
        return "%s::boolean", [value]
    if isinstance(value, int):
        return "%s::integer", [value]
    return "%s::text", [value]


def _compare(left: str, op: str, value: str | int | bool) -> tuple[str, list[Any]]:
    if op in ("like", "not_like"):
        negation = "NOT " if op == "not_like" else ""
        return f"({left}) {negation}LIKE %s::text", [f"%{value}%"]
    placeholder, params = _bind(value)
    return f"({left}) {SQL_OPS[op]} {placeholder}", params


def _text(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)


def _json(prop: str, dotted_as_path: bool) -> tuple[str, list[Any]]:
    keys = prop.split(".") if dotted_as_path else [prop]
    return "user_metadata" + " -> %s::text" * len(keys), list(keys)


def clause_sql(clause: Clause, dotted_as_path: bool) -> tuple[str, list[Any]]:
    op, value = clause.operator, clause.value
    if clause.property in COLUMNS:
        wanted = int if clause.property == "timestamp" else str
        if not isinstance(value, wanted):
            return "FALSE", []
        column = EPOCH if clause.property == "timestamp" else clause.property
        if op in ("like", "not_like"):
            return _compare(f"CAST({column} AS VARCHAR)", op, _text(value))
        if isinstance(value, bool):
            raise Unsupported("bigint compared with boolean")
        return _compare(column, op, value)
    attr, keys = _json(clause.property, dotted_as_path)
    if op in ("like", "not_like"):
        sql, like_params = _compare(_as_text(attr), op, _text(value))
        return sql, [*keys, *like_params]
    text_sql, text_params = _compare(_as_text(attr), op, _text(value))
    parts = [f"WHEN jsonb_typeof({attr}) = 'string' THEN {text_sql}"]
    params: list[Any] = [*keys, *keys, *text_params]
    if isinstance(value, str):
        parts.append(f"WHEN jsonb_typeof({attr}) = 'number' THEN FALSE")
        params += keys
    else:
        number = int(value)  # a bool is 1 / 0
        number_sql, number_params = _compare(f"CAST({_as_text(attr)} AS FLOAT)", op, number)
        parts.append(f"WHEN jsonb_typeof({attr}) = 'number' THEN {number_sql}")
        params += [*keys, *keys, *number_params]
    if isinstance(value, bool):
        bool_sql, bool_params = _compare(f"CAST({_as_text(attr)} AS BOOLEAN)", op, value)
        parts.append(f"WHEN jsonb_typeof({attr}) = 'boolean' THEN {bool_sql}")
        params += [*keys, *keys, *bool_params]
    else:
        parts.append(f"WHEN jsonb_typeof({attr}) = 'boolean' THEN FALSE")
        params += keys
    return "(CASE " + " ".join(parts) + " END)", params


def _as_text(attr: str) -> str:
    """``attr`` with its last ``->`` made ``->>`` (the JSON value's text)."""
    head, _, _ = attr.rpartition(" -> %s::text")
    return f"{head} ->> %s::text"


def filter_sql(filter_: Filter, dotted_as_path: bool) -> tuple[str, list[Any]]:
    if not filter_.clauses:
        return "TRUE", []
    parts: list[str] = []
    params: list[Any] = []
    for item in filter_.clauses:
        if isinstance(item, Filter):
            sql, more = filter_sql(item, dotted_as_path)
        else:
            sql, more = clause_sql(item, dotted_as_path)
        parts.append(f"({sql})")
        params += more
    return f" {filter_.conjunction.upper()} ".join(parts), params


def postgres_keeps(
    pg: Any, filter_: Filter, meta: dict[str, Any], subsecond_us: int
) -> bool | None:
    """Whether Polar's SQL keeps the event under either reading of a dotted property; None when
    PostgreSQL refuses the query (it then bills nothing)."""
    pg.execute("TRUNCATE ev")
    ts = f"{T_S}.{subsecond_us:06d}"
    pg.execute(
        "INSERT INTO ev VALUES (1, 'api_call', 'user', to_timestamp(%s::numeric), %s)",
        [ts, Jsonb(meta)],
    )
    kept = False
    for dotted_as_path in (True, False):
        try:
            sql, params = filter_sql(filter_, dotted_as_path)
        except Unsupported:
            return None
        rows = pg.execute(f"SELECT id FROM ev WHERE {sql}", params).fetchall()
        kept = kept or bool(rows)
    return kept


def check(pg: Any, filter_: Filter, meta: dict[str, Any], subsecond_us: int) -> None:
    stored, view = both_events(meta, subsecond_us)
    kept = postgres_keeps(pg, filter_, meta, subsecond_us)
    core_filter = parse_filter(filter_.to_json())
    if kept:
        assert counts(core_filter, view), "PostgreSQL bills it; the core would not count it"
        assert core_sql_matches(core_filter, view)
    if kept is not None and not has_like_wildcards(filter_) and not _dotted(filter_):
        assert core_sql_matches(core_filter, view) is kept
        assert sql_matches(filter_, stored) is kept


def _dotted(filter_: Filter) -> bool:
    return any(_dotted(c) if isinstance(c, Filter) else "." in c.property for c in filter_.clauses)


dotted_metadata = st.one_of(
    metadata,
    st.fixed_dictionaries({"_cost.amount": st.integers(0, 9)}),
    st.fixed_dictionaries({"_cost.currency": st.sampled_from(["usd", "x"])}),
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(filter_=filters, meta=dotted_metadata, subsecond_us=subseconds)
def test_postgres_against_the_matchers(
    pg: Any, filter_: Filter, meta: dict[str, Any], subsecond_us: int
) -> None:
    check(pg, filter_, meta, subsecond_us)


# Every case of docs/emulator.md's table -------------------------------------------------------

DOC = Path(__file__).parents[2] / "docs" / "emulator.md"
ROW = re.compile(r"^\| `(?P<clause>[^`]+)` \| (?P<meta>[^|]+) \| (?P<sql>✅|❌) \|")


def doc_cases() -> list[tuple[Clause, dict[str, Any], int, bool]]:
    cases = []
    for line in DOC.read_text().splitlines():
        found = ROW.match(line)
        if not found:
            continue
        prop, op, raw = found["clause"].split(" ", 2)
        value = json.loads(raw)
        meta_text = found["meta"].strip()
        subsecond = 600_000 if prop == "timestamp" else 0
        meta = json.loads(meta_text.strip("`")) if meta_text.startswith("`") else {}
        clause = Clause(prop, op, value)  # type: ignore[arg-type]
        cases.append((clause, meta, subsecond, found["sql"] == "✅"))
    return cases


def test_every_documented_case_is_read() -> None:
    assert len(doc_cases()) >= 14


@pytest.mark.parametrize(("clause", "meta", "subsecond_us", "sql_keeps"), doc_cases())
def test_documented_cases(
    pg: Any, clause: Clause, meta: dict[str, Any], subsecond_us: int, sql_keeps: bool
) -> None:
    filter_ = Filter("and", (clause,))
    assert bool(postgres_keeps(pg, filter_, meta, subsecond_us)) is sql_keeps
    check(pg, filter_, meta, subsecond_us)


# Aggregated values ----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    func=st.sampled_from(["sum", "max", "min", "avg"]),
    prop=st.sampled_from(["n", "s", "b", "_cost.amount"]),
    meta=metadata,
)
def test_aggregated_values(pg: Any, func: str, prop: str, meta: dict[str, Any]) -> None:
    """A property counts when its JSON type is number, as a float (booleans and numeric strings
    never); the core's value is never below PostgreSQL's, the emulator's equals it."""
    stored, view = both_events(meta, 0)
    pg.execute("TRUNCATE ev")
    pg.execute(
        "INSERT INTO ev VALUES (1, 'api_call', 'user', to_timestamp(%s), %s)", [T_S, Jsonb(meta)]
    )
    attr, keys = _json(prop, True)
    row = pg.execute(
        f"SELECT CASE WHEN jsonb_typeof({attr}) = 'number' "
        f"THEN CAST({_as_text(attr)} AS FLOAT) END FROM ev",
        [*keys, *keys],
    ).fetchone()
    billed = row[0]
    aggregation = Aggregation(func, prop)  # type: ignore[arg-type]
    assert sql_value(aggregation, stored) == billed
    mine = safe_value(CoreAggregation(func, prop), view)
    assert (mine is None) is (billed is None)
    assert mine is None or mine >= billed
