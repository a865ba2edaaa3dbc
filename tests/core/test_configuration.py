"""Polar's configuration: reducers and the meters they serve (``_configuration``)."""

from __future__ import annotations

from typing import Any

import pytest

from outpost_core import Configuration, Reducer, parse_configuration
from outpost_core._filters import Aggregation, EventView, Filter, InvalidDefinition
from tests.core._payloads import (
    AVERAGE,
    COUNT,
    STANDARD,
    TOKENS,
    UNIQUE,
    configuration,
    reducer,
)

EMPTY_CONFIGURATION = Configuration(reducers={}, meter_reducers={})


def test_parse_standard_configuration() -> None:
    parsed = parse_configuration(STANDARD)
    assert list(parsed.reducers) == [
        "r-count",
        "r-tokens",
        "r-largest",
        "r-smallest",
        "r-average",
        "r-unique",
    ]
    assert parsed.problems == ()
    assert parsed.meter_reducers[COUNT] == "r-count"
    assert parsed.meter_reducers[UNIQUE] == "r-unique"
    tokens = parsed.reducers["r-tokens"]
    assert tokens == Reducer(
        id="r-tokens",
        filter=Filter(conjunction="and", clauses=()),
        aggregation=Aggregation("sum", "tokens"),
        meter_ids=(TOKENS,),
    )


def test_reducer_for() -> None:
    parsed = parse_configuration(STANDARD)
    found = parsed.reducer_for(AVERAGE)
    assert found is not None and found.id == "r-average"
    assert parsed.reducer_for("no-such-meter") is None
    assert EMPTY_CONFIGURATION.reducer_for(COUNT) is None


def test_reducer_for_a_meter_whose_reducer_is_gone() -> None:
    broken = Configuration(reducers={}, meter_reducers={"m": "r-gone"})
    assert broken.reducer_for("m") is None


def test_shared_reducer_serves_several_meters() -> None:
    parsed = parse_configuration(configuration(reducer("r", ["m1", "m2"])))
    assert parsed.reducer_for("m1") is parsed.reducer_for("m2") is parsed.reducers["r"]


def test_contributions_follow_filters_and_skip_unbucketed_and_valueless_reducers() -> None:
    parsed = parse_configuration(STANDARD)
    event = EventView(name="api_call", timestamp_s=0, metadata={"tokens": 7, "user": "u1"})
    assert parsed.contributions(event) == [
        ("r-count", 1.0),
        ("r-tokens", 7.0),
        ("r-largest", 7.0),
        ("r-smallest", 7.0),
        ("r-average", 7.0),
    ]
    other = EventView(name="other", timestamp_s=0, metadata={"tokens": "many"})
    assert parsed.contributions(other) == []
    assert EMPTY_CONFIGURATION.contributions(event) == []


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ("not an object", "a reducer must be an object"),
        ({"meter_ids": []}, "a reducer needs an id"),
        (dict(reducer("r", []), id=""), "a reducer needs an id"),
        (dict(reducer("r", []), id=7), "a reducer needs an id"),
        (dict(reducer("r", []), meter_ids="m"), "meter_ids must be a list of strings"),
        (dict(reducer("r", []), meter_ids=[1]), "meter_ids must be a list of strings"),
        ({"id": "r", "meter_ids": []}, "a filter must be an object"),
        (dict(reducer("r", []), aggregation={"func": "median"}), "unknown aggregation"),
        (dict(reducer("r", []), filter={"conjunction": "xor", "clauses": []}), "conjunction"),
    ],
)
def test_malformed_reducers_are_left_out_with_a_problem(item: Any, problem: str) -> None:
    payload = configuration(reducer("good", ["m-good"]), reducer("also", ["m-also"]))
    payload["reducers"].insert(1, item)
    parsed = parse_configuration(payload)
    assert list(parsed.reducers) == ["good", "also"]
    assert parsed.meter_reducers == {"m-good": "good", "m-also": "also"}
    assert len(parsed.problems) == 1
    assert parsed.problems[0].startswith("reducer #1: ")
    assert problem in parsed.problems[0]


@pytest.mark.parametrize(
    "payload",
    [None, [], "x", {}, {"reducers": None}, {"reducers": {}}, {"reducers": "r"}],
)
def test_payload_without_a_list_of_reducers_is_refused(payload: object) -> None:
    with pytest.raises(InvalidDefinition, match="list of reducers"):
        parse_configuration(payload)


def test_empty_list_of_reducers_is_a_configuration() -> None:
    parsed = parse_configuration({"reducers": []})
    assert parsed == Configuration(reducers={}, meter_reducers={})


def test_organization_id() -> None:
    assert parse_configuration(STANDARD).organization_id == "org"
    assert parse_configuration({"reducers": []}).organization_id is None
    assert parse_configuration({"reducers": [], "organization_id": 7}).organization_id is None
