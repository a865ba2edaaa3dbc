"""Polar's snapshots: parsing, and the per-customer flow that applies them (``_snapshots``)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from outpost_core import Aggregate, Customer
from outpost_core._snapshots import (
    MAX_IDS_PER_QUESTION,
    CustomerFlow,
    MalformedSnapshot,
    Snapshot,
    Step,
    customer_in,
    parse_snapshot,
)

COLD = 1_796_223_600_000_000
C1 = Customer("external", "c1")


def payload(**overrides: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "request_id": "s1",
        "snapshot_id": "snap-1",
        "external_customer_id": "c1",
        "as_of": COLD + 5,
        "cold_until": COLD,
        "reducers": {
            "r1": {"count": 2, "sum": 3, "min": 1, "max": 2},
            "r2": {"count": 0, "sum": 0},
        },
        "credited": {"m1": 10, "m2": 2.5},
    }
    out.update(overrides)
    return {k: v for k, v in out.items() if v is not DROP}


DROP: Any = object()


def test_parse_a_snapshot() -> None:
    assert parse_snapshot(payload()) == Snapshot(
        snapshot_id="snap-1",
        request_id="s1",
        customer=C1,
        as_of=COLD + 5,
        cold_until=COLD,
        reducers={"r1": Aggregate(count=2, sum=3.0, min=1.0, max=2.0), "r2": Aggregate()},
        credited={"m1": 10.0, "m2": 2.5},
    )


def test_a_pushed_snapshot_has_no_request_id() -> None:
    assert parse_snapshot(payload(request_id=None)).request_id is None
    assert parse_snapshot(payload(request_id=DROP)).request_id is None


def test_by_customer_id() -> None:
    uuid = "9f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
    parsed = parse_snapshot(payload(external_customer_id=DROP, customer_id=uuid))
    assert parsed.customer == Customer("customer", uuid)


def test_empty_reducers_and_credits() -> None:
    parsed = parse_snapshot(payload(reducers={}, credited={}, cold_until=0, as_of=0))
    assert (parsed.reducers, parsed.credited, parsed.cold_until) == ({}, {}, 0)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (None, "payload is not an object"),
        ([], "payload is not an object"),
        (payload(snapshot_id=DROP), "snapshot_id missing"),
        (payload(snapshot_id=""), "snapshot_id missing"),
        (payload(snapshot_id=17), "snapshot_id missing"),
        (payload(request_id=17), "request_id is not a string"),
        (payload(external_customer_id=DROP), "exactly one of"),
        (payload(customer_id="u"), "exactly one of"),
        (payload(external_customer_id=3), "exactly one of"),
        (payload(as_of=DROP), "as_of is not a non-negative integer"),
        (payload(as_of=-1), "as_of is not a non-negative integer"),
        (payload(as_of=1.0), "as_of is not a non-negative integer"),
        (payload(as_of=True), "as_of is not a non-negative integer"),
        (payload(cold_until="0"), "cold_until is not a non-negative integer"),
        (payload(cold_until=COLD + 1), "cold_until is not a bucket boundary"),
        (payload(reducers=DROP), "reducers and credited must be objects"),
        (payload(credited=[]), "reducers and credited must be objects"),
        (payload(reducers={"r": {"count": 1}}), "reducer 'r' has no valid aggregate"),
        (payload(reducers={"r": None}), "reducer 'r' has no valid aggregate"),
        (payload(credited={"m": "10"}), "credited\\['m'\\] is not a number"),
        (payload(credited={"m": True}), "credited\\['m'\\] is not a number"),
        (payload(credited={"m": math.nan}), "credited\\['m'\\] is not a number"),
        (payload(credited={"m": None}), "credited\\['m'\\] is not a number"),
    ],
)
def test_malformed_snapshots(bad: object, message: str) -> None:
    with pytest.raises(MalformedSnapshot, match=message):
        parse_snapshot(bad)


@pytest.mark.parametrize("units", [math.inf, -math.inf, 10**400])
def test_credits_beyond_floats_are_malformed(units: float) -> None:
    with pytest.raises(MalformedSnapshot):
        parse_snapshot(payload(credited={"m": units}))


def test_customer_in() -> None:
    assert customer_in({"external_customer_id": "x"}) == Customer("external", "x")
    assert customer_in({"customer_id": "u", "external_customer_id": None}) == Customer(
        "customer", "u"
    )
    bads: list[dict[object, object]] = [
        {},
        {"external_customer_id": "x", "customer_id": "u"},
        {"customer_id": 1},
    ]
    for bad in bads:
        with pytest.raises(MalformedSnapshot):
            customer_in(bad)


def snapshot(cold_until: int, as_of: int) -> Snapshot:
    return Snapshot("s", None, C1, as_of=as_of, cold_until=cold_until, reducers={}, credited={})


def test_newer_than_orders_by_cold_until_then_as_of() -> None:
    base = snapshot(COLD, 10)
    assert snapshot(COLD + 300_000_000, 0).newer_than(base)
    assert snapshot(COLD, 11).newer_than(base)
    assert not snapshot(COLD, 10).newer_than(base)
    assert not snapshot(COLD, 9).newer_than(base)
    assert not snapshot(COLD - 300_000_000, 99).newer_than(base)


def progress(flow: CustomerFlow) -> tuple[Step, Snapshot | None, Snapshot | None]:
    return flow.step, flow.current, flow.waiting


def test_flow_starts_the_first_snapshot_and_keeps_the_newest_waiting() -> None:
    flow = CustomerFlow(C1)
    assert (flow.step, flow.applied, flow.request_id) == (Step.IDLE, False, None)
    first = snapshot(COLD, 1)
    assert flow.offer(first)
    assert flow.current is first
    flow.step = Step.LISTING
    older, newer, newest = snapshot(COLD, 0), snapshot(COLD, 5), snapshot(COLD, 9)
    assert not flow.offer(newer)
    assert not flow.offer(older)  # older than the waiting one: dropped
    assert flow.waiting is newer
    assert not flow.offer(newest)
    assert flow.waiting is newest
    flow.candidates["e"] = ["k\nf"]
    flow.questions.add("q1")
    flow.counted.add("e")
    assert flow.finish() is newest
    assert progress(flow) == (Step.IDLE, newest, None)
    assert (flow.candidates, flow.questions, flow.counted) == ({}, set(), set())
    assert flow.finish() is None


def test_flow_reset_abandons_everything_but_applied() -> None:
    flow = CustomerFlow(C1, request_id="s1", applied=True)
    flow.offer(snapshot(COLD, 1))
    flow.step = Step.ASKING
    flow.waiting = snapshot(COLD, 2)
    flow.candidates["e"] = ["k\nf"]
    flow.questions.add("q")
    flow.counted.add("e")
    flow.reset()
    assert flow == CustomerFlow(C1, applied=True)


def test_question_size() -> None:
    assert MAX_IDS_PER_QUESTION == 10_000
