from __future__ import annotations

from typing import Any

import httpx
import pytest

from outpost_emulator import Emulator, EmulatorError
from tests.emulator.helpers import COUNT_ALL, Ws, clause, where

SUM_TOKENS = {"func": "sum", "property": "metadata.tokens"}


def meter_body(**fields: Any) -> dict[str, Any]:
    return {"name": "API calls", "filter": COUNT_ALL, "aggregation": {"func": "count"}, **fields}


def create(http: httpx.Client, **fields: Any) -> httpx.Response:
    return http.post("/v1/meters/", json=meter_body(**fields))


def test_create_and_read_meters(emu: Emulator, http: httpx.Client) -> None:
    response = create(
        http,
        filter=where(clause("metadata.model", "eq", "gpt"), clause("name", "like", "call")),
        aggregation=SUM_TOKENS,
        metadata={"team": "core"},
    )
    assert response.status_code == 201
    meter = response.json()
    assert set(meter) >= {
        "id", "created_at", "modified_at", "name", "unit", "custom_label", "custom_multiplier",
        "filter", "aggregation", "organization_id", "archived_at", "metadata",
    }  # fmt: skip
    # Polar strips a leading "metadata." from properties.
    assert meter["filter"]["clauses"][0]["property"] == "model"
    assert meter["aggregation"] == {"func": "sum", "property": "tokens"}
    assert meter["unit"] == "scalar"
    assert meter["organization_id"] == emu.state()["organization_id"]
    assert http.get(f"/v1/meters/{meter['id']}").json() == meter

    reducers = emu.state()["reducers"]
    assert len(reducers) == 1
    assert reducers[0]["meter_ids"] == [meter["id"]]
    assert reducers[0]["id"] != meter["id"]
    assert reducers[0]["filter"] == meter["filter"]
    assert reducers[0]["aggregation"] == meter["aggregation"]


def test_list_is_paginated(http: httpx.Client) -> None:
    for name in ("first", "second", "third"):
        assert create(http, name=name).status_code == 201
    page = http.get("/v1/meters/", params={"limit": 2}).json()
    assert page["pagination"] == {"total_count": 3, "max_page": 2}
    assert [m["name"] for m in page["items"]] == ["first", "second"]
    page2 = http.get("/v1/meters/", params={"limit": 2, "page": 2}).json()
    assert [m["name"] for m in page2["items"]] == ["third"]
    assert http.get("/v1/meters/", params={"query": "SEC"}).json()["pagination"]["total_count"] == 1
    assert http.get("/v1/meters/", params={"page": 0}).status_code == 422


def test_unknown_and_malformed_meter_ids(http: httpx.Client) -> None:
    missing = http.get("/v1/meters/3b1f9c9e-8f0e-4c1a-9a4e-0d3c2b1a0f9e")
    assert missing.status_code == 404
    assert missing.json()["detail"] == "Not found"
    assert http.get("/v1/meters/nope").status_code == 422


def errors(response: httpx.Response) -> list[tuple[list[Any], str]]:
    assert response.status_code == 422, response.text
    return [(item["loc"], item["type"]) for item in response.json()["detail"]]


C0 = ["body", "filter", "clauses", 0]
CLAUSE, NESTED = [*C0, "FilterClause"], [*C0, "Filter"]
NOT_A_FILTER = [([*NESTED, "conjunction"], "missing"), ([*NESTED, "clauses"], "missing")]
VALUE_BRANCHES = [[*CLAUSE, "value", tag] for tag in ("constrained-str", "constrained-int", "bool")]
INNER = [*NESTED, "clauses", 0]
METADATA_K = ["body", "metadata", "k"]
ORG = "3b1f9c9e-8f0e-4c1a-9a4e-0d3c2b1a0f9e"

VALIDATION_CASES: list[tuple[dict[str, Any], list[tuple[list[Any], str]]]] = [
    ({"name": "ab"}, [(["body", "name"], "string_too_short")]),
    ({"filter": 5}, [(["body", "filter"], "model_type")]),
    (
        {"filter": {"conjunction": "xor", "clauses": []}},
        [(["body", "filter", "conjunction"], "enum")],
    ),
    ({"filter": {"conjunction": "and"}}, [(["body", "filter", "clauses"], "missing")]),
    (
        {"filter": {"conjunction": "and", "clauses": 3}},
        [(["body", "filter", "clauses"], "list_type")],
    ),
    (
        {"filter": where(clause("a", "matches", "x"))},
        [([*CLAUSE, "operator"], "enum"), *NOT_A_FILTER],
    ),
    (
        {"filter": where(clause("a", "eq", 1.5))},
        [
            (VALUE_BRANCHES[0], "string_type"),
            (VALUE_BRANCHES[1], "int_from_float"),
            (VALUE_BRANCHES[2], "bool_type"),
            *NOT_A_FILTER,
        ],
    ),
    (
        {"filter": where(clause("a", "eq", 2**31))},
        [
            (VALUE_BRANCHES[0], "string_type"),
            (VALUE_BRANCHES[1], "less_than_equal"),
            (VALUE_BRANCHES[2], "bool_parsing"),
            *NOT_A_FILTER,
        ],
    ),
    (
        {"filter": where(where({"property": 1, "operator": "eq", "value": 1}))},
        [
            ([*CLAUSE, "property"], "missing"),
            ([*CLAUSE, "operator"], "missing"),
            ([*CLAUSE, "value"], "missing"),
            ([*INNER, "FilterClause", "property"], "string_type"),
            ([*INNER, "Filter", "conjunction"], "missing"),
            ([*INNER, "Filter", "clauses"], "missing"),
        ],
    ),
    ({"aggregation": 5}, [(["body", "aggregation"], "model_attributes_type")]),
    ({"aggregation": {}}, [(["body", "aggregation"], "union_tag_not_found")]),
    ({"aggregation": {"func": "median"}}, [(["body", "aggregation"], "union_tag_invalid")]),
    (
        {"aggregation": {"func": "sum"}},
        [(["body", "aggregation", "sum", "property"], "missing")],
    ),
    (
        {"aggregation": {"func": "unique", "property": 3}},
        [(["body", "aggregation", "unique", "property"], "string_type")],
    ),
    ({"unit": "custom"}, [(["body"], "value_error")]),
    ({"custom_label": "req"}, [(["body"], "value_error")]),
    (
        {"unit": "custom", "custom_label": "req", "custom_multiplier": 0},
        [(["body", "custom_multiplier"], "greater_than")],
    ),
    (
        {"metadata": {"k": ""}},
        [
            ([*METADATA_K, "constrained-str"], "string_too_short"),
            ([*METADATA_K, "int"], "int_parsing"),
            ([*METADATA_K, "float"], "float_parsing"),
            ([*METADATA_K, "bool"], "bool_parsing"),
        ],
    ),
    ({"organization_id": ORG}, [(["body", "organization_id"], "organization_token")]),
]


@pytest.mark.parametrize(("fields", "expected"), VALIDATION_CASES)
def test_meter_validation(
    shared_emu: Emulator, shared_http: httpx.Client, fields: dict[str, Any], expected: list[Any]
) -> None:
    assert errors(create(shared_http, **fields)) == expected
    assert shared_emu.state()["meters"] == []


def test_missing_fields(http: httpx.Client) -> None:
    response = http.post("/v1/meters/", json={})
    assert sorted(loc[-1] for loc, _ in errors(response)) == ["aggregation", "filter", "name"]


def test_accepted_clause_values(http: httpx.Client) -> None:
    response = create(
        http,
        filter=where(
            clause("a", "eq", 3.0),  # pydantic's lax int: 3.0 -> 3
            clause("b", "ne", True),
            clause("c", "lte", -(2**31)),
            clause("d", "like", "x" * 1000),
            where(clause("e", "gt", "5"), conjunction="or"),
            where(conjunction="or"),
        ),
        unit="custom",
        custom_label="request",
        custom_multiplier=1000,
    )
    assert response.status_code == 201, response.text
    values = [c.get("value") for c in response.json()["filter"]["clauses"]]
    assert values[:3] == [3, True, -(2**31)]
    assert isinstance(values[0], int)


def test_python_api_create_meter_validates(emu: Emulator) -> None:
    with pytest.raises(EmulatorError) as info:
        emu.create_meter("m", COUNT_ALL, {"func": "count"})
    assert info.value.status == 422
    assert info.value.detail[0]["loc"] == ["body", "name"]


def test_new_meter_pushes_configuration(emu: Emulator, ws: Ws) -> None:
    ws.sync_point()
    meter = emu.create_meter("tokens", where(clause("name", "eq", "llm")), SUM_TOKENS)
    pushed = ws.expect("configuration")
    assert pushed["organization_id"] == emu.state()["organization_id"]
    assert [m["id"] for m in pushed["meters"]] == [meter["id"]]
    (reducer,) = pushed["reducers"]
    assert reducer["meter_ids"] == [meter["id"]]
    assert reducer["filter"] == meter["filter"]
    assert reducer["aggregation"] == {"func": "sum", "property": "tokens"}


def test_unique_meters_are_configured_but_not_reduced(emu: Emulator, ws: Ws) -> None:
    unique = emu.create_meter("users", COUNT_ALL, {"func": "unique", "property": "user"})
    count = emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ws.expect("configuration")  # pushed for the first meter
    config = ws.expect("configuration")  # pushed for the second
    assert {r["aggregation"]["func"] for r in config["reducers"]} == {"unique", "count"}
    snapshot = ws.snapshot(external_customer_id="c1")
    count_reducer = [r["id"] for r in config["reducers"] if r["meter_ids"] == [count["id"]]]
    assert list(snapshot["reducers"]) == count_reducer
    assert snapshot["credited"] == {unique["id"]: 0, count["id"]: 0}
