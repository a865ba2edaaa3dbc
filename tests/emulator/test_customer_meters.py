from __future__ import annotations

from typing import Any

import httpx
import pytest

from outpost_emulator import Emulator, EmulatorError
from tests.emulator.helpers import COUNT_ALL, START_US, clause, event, ingest_ok, where

LLM = where(clause("name", "eq", "llm"))


def items(http: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    response = http.get("/v1/customer-meters/", params=params)
    assert response.status_code == 200, response.text
    result: list[dict[str, Any]] = response.json()["items"]
    return result


def one(http: httpx.Client, meter_id: str, **identity: str) -> dict[str, Any]:
    (item,) = items(http, meter_id=meter_id, **identity)
    return item


def feed(http: httpx.Client) -> None:
    ingest_ok(
        http,
        event("llm", tokens=10, user="u1"),
        event("llm", tokens=2.5, user="u2", at=START_US - 3600_000_000),  # an hour ago
        event("llm", tokens=7, user="u1"),
        event("llm", tokens=True, user=1),  # a bool is not a number
        event("llm", tokens="12", user=1.0),  # nor is a string; 1 and 1.0 are one value
        event("llm"),  # no tokens, no user
        event("other", tokens=100, user="u9"),  # filtered out
        event("llm", ext="c2", tokens=1000, user="u7"),  # another customer
    )


@pytest.mark.parametrize(
    ("aggregation", "consumed"),
    [
        ({"func": "count"}, 6.0),
        ({"func": "sum", "property": "tokens"}, 19.5),
        ({"func": "avg", "property": "tokens"}, 6.5),
        ({"func": "min", "property": "tokens"}, 2.5),
        ({"func": "max", "property": "tokens"}, 10.0),
        ({"func": "unique", "property": "user"}, 3.0),
    ],
)
def test_consumed_per_aggregation(
    emu: Emulator, http: httpx.Client, aggregation: dict[str, Any], consumed: float
) -> None:
    meter = emu.create_meter("m-" + aggregation["func"], LLM, aggregation)
    feed(http)
    item = one(http, meter["id"], external_customer_id="c1")
    assert item["consumed_units"] == consumed
    assert isinstance(item["consumed_units"], float)
    assert item["credited_units"] == 0
    assert item["balance"] == -consumed
    assert item["meter_id"] == meter["id"]
    assert item["external_customer_id"] == "c1"
    assert item["customer_id"] is None  # an external-only customer (see docs)


@pytest.mark.parametrize("func", ["avg", "min", "max", "sum"])
def test_property_aggregations_of_nothing_are_zero(
    emu: Emulator, http: httpx.Client, func: str
) -> None:
    meter = emu.create_meter("tokens", LLM, {"func": func, "property": "tokens"})
    ingest_ok(http, event("llm", tokens="many"))
    assert one(http, meter["id"], external_customer_id="c1")["consumed_units"] == 0.0
    assert emu.customer_meter(meter["id"], external_customer_id="nobody")["consumed_units"] == 0.0


def test_credits_are_a_non_negative_running_sum(emu: Emulator, http: httpx.Client) -> None:
    meter = emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ingest_ok(http, event(), event(), event())
    assert emu.grant_credits(meter["id"], 100, external_customer_id="c1")["credited_units"] == 100
    assert emu.grant_credits(meter["id"], -30, external_customer_id="c1")["credited_units"] == 70
    item = one(http, meter["id"], external_customer_id="c1")
    assert (item["credited_units"], item["consumed_units"], item["balance"]) == (70, 3.0, 67.0)
    assert emu.grant_credits(meter["id"], -500, external_customer_id="c1")["credited_units"] == 0
    assert emu.grant_credits(meter["id"], 10, external_customer_id="c1")["credited_units"] == 10
    assert one(http, meter["id"], external_customer_id="c1")["balance"] == 7.0


def test_one_customer_whichever_reference_the_events_used(
    emu: Emulator, http: httpx.Client
) -> None:
    meter = emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ingest_ok(http, event(ext="acme"))  # before the customer exists
    customer = emu.create_customer("acme")
    ingest_ok(http, event(ext=None, customer_id=customer["id"]), event(ext="acme"))
    emu.grant_credits(meter["id"], 5, customer_id=customer["id"])
    emu.grant_credits(meter["id"], 5, external_customer_id="acme")
    by_external = one(http, meter["id"], external_customer_id="acme")
    by_id = one(http, meter["id"], customer_id=customer["id"])
    assert by_external == by_id
    assert by_id["consumed_units"] == 3.0
    assert by_id["credited_units"] == 10
    assert by_id["customer_id"] == customer["id"]
    assert by_id["customer"]["external_id"] == "acme"
    assert emu.customer_meter(meter["id"], customer_id=customer["id"]) == by_id


def test_listing_and_filters(emu: Emulator, http: httpx.Client) -> None:
    calls = emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    llm = emu.create_meter("llm", LLM, {"func": "count"})
    ingest_ok(http, event("llm", ext="a"), event("x", ext="b"))
    emu.grant_credits(llm["id"], 1, external_customer_id="b")  # credits activate a row too
    everything = http.get("/v1/customer-meters/").json()
    assert everything["pagination"] == {"total_count": 4, "max_page": 1}
    assert len(items(http, meter_id=calls["id"])) == 2
    assert len(items(http, external_customer_id="a")) == 2
    assert len(items(http, external_customer_id=["a", "b"], meter_id=llm["id"])) == 2
    # A customer without a matching event or credit has no row, as in Polar.
    assert items(http, external_customer_id="nobody") == []
    assert http.get("/v1/customer-meters/", params={"customer_id": "nope"}).status_code == 422


def test_current_bucket_events_count_for_customer_meters(emu: Emulator, http: httpx.Client) -> None:
    meter = emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ingest_ok(http, event())
    assert emu.state()["events"]["current"] == 1
    assert one(http, meter["id"], external_customer_id="c1")["consumed_units"] == 1.0


def test_admin_credit_errors(emu: Emulator, admin: httpx.Client) -> None:
    meter = emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    cases = [
        ({"meter_id": "nope", "external_customer_id": "c", "units": 1}, 404),
        ({"meter_id": meter["id"], "units": 1}, 422),
        (
            {"meter_id": meter["id"], "external_customer_id": "c", "customer_id": "x", "units": 1},
            422,
        ),
        (
            {
                "meter_id": meter["id"],
                "customer_id": "3b1f9c9e-8f0e-4c1a-9a4e-0d3c2b1a0f9e",
                "units": 1,
            },
            404,
        ),
        ({"meter_id": meter["id"], "external_customer_id": "c", "units": 1.5}, 422),
        ({"meter_id": meter["id"], "external_customer_id": "c", "units": True}, 422),
    ]
    for body, status in cases:
        response = admin.post("/credits", json=body)
        assert response.status_code == status, (body, response.text)
    ok = admin.post(
        "/credits", json={"meter_id": meter["id"], "external_customer_id": "c", "units": 3}
    )
    assert ok.json()["credited_units"] == 3
    with pytest.raises(EmulatorError):
        emu.customer_meter("nope", external_customer_id="c")
