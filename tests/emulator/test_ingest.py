from __future__ import annotations

from typing import Any

import httpx
import pytest

from outpost_emulator import Emulator
from tests.emulator.helpers import B1500, MIN_US, START_US, event, ingest, ingest_ok


def errors_of(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "RequestValidationError"
    detail: list[dict[str, Any]] = body["detail"]
    for item in detail:
        assert set(item) >= {"loc", "msg", "type", "input"}
    return detail


def test_ingest_stores_events(emu: Emulator, http: httpx.Client) -> None:
    assert ingest_ok(http, event(id="e1"), event(id="e2"), event()) == {
        "inserted": 3,
        "duplicates": 0,
    }
    assert emu.state()["events"]["count"] == 3


def test_empty_batch(http: httpx.Client) -> None:
    assert ingest_ok(http) == {"inserted": 0, "duplicates": 0}


def test_duplicates_within_one_request(emu: Emulator, http: httpx.Client) -> None:
    result = ingest_ok(http, event(id="e1"), event(id="e1"), event(id="e2"), event(), event())
    assert result == {"inserted": 4, "duplicates": 1}
    assert emu.state()["events"]["count"] == 4


def test_duplicates_across_requests_forever(emu: Emulator, http: httpx.Client) -> None:
    assert ingest_ok(http, event(id="e1"))["inserted"] == 1
    emu.advance(7 * 24 * 3600)
    # Same external_id, even for another customer and name: Polar's unique index is per org.
    again = ingest_ok(http, event("other", ext="c2", id="e1"), event(id="e3"))
    assert again == {"inserted": 1, "duplicates": 1}
    assert emu.state()["events"]["count"] == 2


def test_every_bad_event_is_reported_and_nothing_is_stored(
    emu: Emulator, http: httpx.Client
) -> None:
    response = ingest(
        http,
        {"external_customer_id": "c1"},  # 0: no name
        event(id="good"),  # 1: valid
        event("x" * 129),  # 2: name too long
        event(at=START_US + 1),  # 3: in the future
        event(customer_id="3b1f9c9e-8f0e-4c1a-9a4e-0d3c2b1a0f9e", ext=None),  # 4: unknown
        event(tokens=""),  # 5: empty metadata string
        event(),  # 6: valid
        {"name": "both", "external_customer_id": "c1", "customer_id": "x"},  # 7
        {"name": "neither"},  # 8
    )
    detail = errors_of(response)
    assert {item["loc"][2] for item in detail} == {0, 2, 3, 4, 5, 7, 8}
    for item in detail:
        assert item["loc"][:2] == ["body", "events"]
    assert emu.state()["events"]["count"] == 0
    # The same external_id is accepted once the batch is fixed: nothing was kept.
    assert ingest_ok(http, event(id="good"))["inserted"] == 1


def single_error(http: httpx.Client, bad: dict[str, Any]) -> list[dict[str, Any]]:
    detail = errors_of(ingest(http, event(), bad))
    assert all(item["loc"][2] == 1 for item in detail)
    return detail


@pytest.mark.parametrize(
    ("bad", "loc", "type_"),
    [
        ({"external_customer_id": "c1"}, ["name"], "missing"),
        (event(""), ["name"], "string_too_short"),
        (event("x" * 129), ["name"], "string_too_long"),
        (event(7), ["name"], "string_type"),  # type: ignore[arg-type]
        (event("a\x00b"), ["name"], "value_error"),
        ({**event(), "timestamp": "garbage"}, ["timestamp"], "datetime_from_date_parsing"),
        ({**event(), "timestamp": "2026-12-02T15:00:00"}, ["timestamp"], "timezone_aware"),
        ({**event(), "timestamp": 1796223600}, ["timestamp"], "datetime_type"),
        ({**event(), "timestamp": "2026-12-02T15:02:00.000001Z"}, ["timestamp"], "value_error"),
        ({**event(), "external_id": 5}, ["external_id"], "string_type"),
        ({**event(), "external_customer_id": 5}, ["external_customer_id"], "string_type"),
        (event(customer_id="not-a-uuid", ext=None), ["customer_id"], "uuid_parsing"),
        (
            event(customer_id="00000000-0000-1000-8000-000000000000", ext=None),
            ["customer_id"],
            "uuid_version",
        ),
        (
            event(customer_id="3b1f9c9e-8f0e-4c1a-9a4e-0d3c2b1a0f9e", ext=None),
            ["customer_id"],
            "customer_id",
        ),
        (
            {**event(), "organization_id": "3b1f9c9e-8f0e-4c1a-9a4e-0d3c2b1a0f9e"},
            ["organization_id"],
            "organization_token",
        ),
        ({**event(), "metadata": []}, ["metadata"], "dict_type"),
        (event(k="x" * 501), ["metadata", "k", "constrained-str"], "string_too_long"),
        (event(k=None), ["metadata", "k", "constrained-str"], "string_type"),
        (event(k={"nested": 1}), ["metadata", "k", "int"], "int_type"),
        (event(k=[1]), ["metadata", "k", "bool"], "bool_type"),
        (event(k="a\x00"), ["metadata"], "value_error"),
        (
            event(_cost={"amount": 1, "currency": "eur"}),
            ["metadata", "_cost", "currency"],
            "string_pattern_mismatch",
        ),
        (
            event(_cost={"amount": "abc", "currency": "usd"}),
            ["metadata", "_cost", "amount"],
            "decimal_parsing",
        ),
        (event(_cost={"currency": "usd"}), ["metadata", "_cost", "amount"], "missing"),
        (event(_cost=3), ["metadata", "_cost"], "dict_type"),
        (
            event(_llm={"vendor": "v", "model": "m", "input_tokens": 1, "output_tokens": 1}),
            ["metadata", "_llm", "total_tokens"],
            "missing",
        ),
        (
            event(
                _llm={
                    "vendor": "v",
                    "model": "m",
                    "input_tokens": 1.5,
                    "output_tokens": 1,
                    "total_tokens": 2,
                }
            ),
            ["metadata", "_llm", "input_tokens"],
            "int_from_float",
        ),
    ],
)
def test_each_validation_error(
    shared_http: httpx.Client, bad: dict[str, Any], loc: list[Any], type_: str
) -> None:
    detail = single_error(shared_http, bad)
    assert [item["type"] for item in detail if item["loc"][3:] == loc] == [type_], detail


def test_non_finite_metadata_is_refused(http: httpx.Client) -> None:
    raw = '{"events": [{"name": "x", "external_customer_id": "c1", "metadata": {"n": NaN}}]}'
    response = http.post(
        "/v1/events/ingest", content=raw, headers={"content-type": "application/json"}
    )
    detail = errors_of(response)
    assert detail[0]["loc"] == ["body", "events", 0, "metadata", "n"]
    assert detail[0]["type"] == "finite_number"


def test_both_or_neither_customer_reference(http: httpx.Client) -> None:
    both = single_error(http, {**event(), "customer_id": "3b1f9c9e-8f0e-4c1a-9a4e-0d3c2b1a0f9e"})
    assert [item["type"] for item in both] == ["customer_identity"]
    neither = single_error(http, {"name": "x"})
    assert sorted(item["loc"][3] for item in neither) == ["customer_id", "external_customer_id"]
    assert {item["type"] for item in neither} == {"missing"}


@pytest.mark.parametrize(
    ("raw", "type_", "loc"),
    [
        (b"{not json", "json_invalid", ["body", 1]),
        (b"", "missing", ["body"]),
        (b"[]", "model_attributes_type", ["body"]),
        (b"{}", "missing", ["body", "events"]),
        (b'{"events": {}}', "list_type", ["body", "events"]),
        (b'{"events": [5]}', "model_attributes_type", ["body", "events", 0]),
    ],
)
def test_malformed_bodies(
    shared_http: httpx.Client, raw: bytes, type_: str, loc: list[Any]
) -> None:
    response = shared_http.post(
        "/v1/events/ingest", content=raw, headers={"content-type": "application/json"}
    )
    detail = errors_of(response)
    assert (detail[0]["type"], detail[0]["loc"]) == (type_, loc)


def test_accepted_shapes(emu: Emulator, http: httpx.Client) -> None:
    customer = emu.create_customer("acme")
    result = ingest_ok(
        http,
        event(s="text", i=-3, f=2.5, b=True, big=2**60),
        event(
            _cost={"amount": "0.012", "currency": "usd"},
            _llm={
                "vendor": "openai",
                "model": "m",
                "input_tokens": 3,
                "output_tokens": "4",
                "total_tokens": 7,
                "cached_input_tokens": 1,
                "extra": "dropped",
            },
        ),
        event(ext=None, customer_id=customer["id"].upper()),
        {
            **event(),
            "unknown_field": {"is": "ignored"},
            "parent_id": "p",
            "external_member_id": "m",
        },
        {**event(ext=""), "timestamp": "2026-12-02T16:01:00+01:00"},
    )
    assert result == {"inserted": 5, "duplicates": 0}


def test_timestamps_are_normalised_to_utc_and_default_to_now(
    emu: Emulator, http: httpx.Client
) -> None:
    meter = emu.create_meter("calls", {"conjunction": "and", "clauses": []}, {"func": "count"})
    ingest_ok(
        http,
        {**event(id="tz"), "timestamp": "2026-12-02T15:54:00+01:00"},  # 14:54 UTC, late
        event(id="now"),  # no timestamp: now, the current bucket
    )
    state = emu.state()
    rows = {r["event_ids"][0]: r for r in state["pipeline"]["rows"]}
    assert rows["tz"]["bucket_start"] == B1500 - 2 * 300_000_000 + 0 * MIN_US
    assert state["pipeline"]["current_buckets"] == {str(B1500): ["now"]}
    assert meter["id"]


def test_customer_id_events(emu: Emulator, http: httpx.Client) -> None:
    customer = emu.create_customer()
    assert ingest_ok(http, event(ext=None, customer_id=customer["id"]))["inserted"] == 1
