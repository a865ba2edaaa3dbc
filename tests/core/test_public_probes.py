"""Quantities probes: the request, its answer read from a hostile body, what the planner learns
of a followed customer meter, and what a probe's answer writes into the state hash."""

from __future__ import annotations

import json

import pytest

from outpost_core._mirror import derive_state
from outpost_core._public_anchoring import PUBLIC_SID, anchor
from outpost_core._public_ledger import Outcome
from outpost_core._public_polls import DAY_US, QuantitiesProbe, interval_for
from outpost_core._public_probes import (
    PROBE_LAG_US,
    followed_of,
    parse_quantities,
    probe_anchor,
    probe_params,
    quantities_path,
)
from outpost_core._public_readings import PolarReading

SEC = 1_000_000
MARGIN = 10 * SEC
T0 = 1_800_000_000 * SEC


def reading(consumed: float, credited: int, modified_at: int | None) -> PolarReading:
    return PolarReading("c1", None, "m", consumed, credited, credited - consumed, modified_at)


def test_the_request() -> None:
    assert quantities_path("a/b c") == "/v1/meters/a%2Fb%20c/quantities"
    probe = QuantitiesProbe("c1", "m", T0 + 1, T0 + DAY_US - 1, "hour")
    assert probe_params(probe) == (
        ("external_customer_id", "c1"),
        ("start_timestamp", "2027-01-15T08:00:00Z"),
        ("end_timestamp", "2027-01-16T08:00:00Z"),
        ("interval", "hour"),
    )


def test_a_customer_named_by_polars_id_is_probed_by_customer_id() -> None:
    probe = QuantitiesProbe("u1", "m", T0, T0 + DAY_US, "hour", "customer")
    assert probe_params(probe)[0] == ("customer_id", "u1")


def test_the_interval_is_the_finest_polar_serves_over_the_span() -> None:
    assert interval_for(7 * DAY_US) == "hour"
    assert interval_for(31 * DAY_US) == "day"
    assert interval_for(400 * DAY_US) == "month"
    assert interval_for(2000 * DAY_US) == "year"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{", "quantities: not JSON"),
        (b"[1]", "quantities without a numeric total"),
        (b'{"total": "3"}', "quantities without a numeric total"),
        (b'{"total": true}', "quantities without a numeric total"),
        (b'{"total": -1}', "quantities: a total of -1"),
        (b'{"total": 1e999}', "quantities: a total of inf"),
        (b"[" * 100_000, "quantities: JSON nested too deeply"),
        (b" " * (8 * 1024 * 1024 + 1), "quantities: body of"),
    ],
)
def test_a_body_that_is_not_a_quantities_answer_is_a_problem(body: bytes, problem: str) -> None:
    answer = parse_quantities(body)
    assert answer.total is None and answer.problem is not None
    assert answer.problem.startswith(problem)


def test_a_quantities_answer() -> None:
    body = json.dumps({"quantities": [{"timestamp": "x", "quantity": 2}], "total": 2}).encode()
    assert parse_quantities(body).total == 2.0


def test_what_the_planner_learns_of_a_followed_customer_meter() -> None:
    first = anchor("count", MARGIN, {}, {}, reading(3, 10, T0))
    assert first.write is not None
    pub = json.loads(first.write.pub)
    pub["h"] = T0 - 5
    fields = {
        "sid": PUBLIC_SID,
        "cu": "0",
        "p": first.write.polar,
        "c:m": "10",
        "a:1": "2 2 1 1",
        "n": "2",
        "pub": json.dumps(pub),
    }
    state, text = derive_state(fields), fields["pub"]
    view = followed_of("c1", "m", "count", state, text)
    assert (view.balance, view.pending_events, view.window_start_us) == (5, 2, T0 - 5)
    assert followed_of("u1", "m", "count", state, text, "customer").key == ("customer", "u1", "m")
    assert followed_of("c1", "m", "max", state, text).balance is None  # never probed
    assert followed_of("c1", "m", "count", derive_state({}), None).balance is None  # no anchor
    for bad in ("{", '{"h": true}', "[]"):
        assert followed_of("c1", "m", "count", state, bad).window_start_us is None


def test_a_probe_re_anchors_consumed_and_keeps_credits_and_modified_at() -> None:
    events = {"1:e1": f"2 {T0 + 100 * SEC}", "1:e2": f"1 {T0 + 195 * SEC}", "1:e3": "4"}
    first = anchor("sum", MARGIN, {}, events, reading(3, 10, T0))
    assert first.write is not None and first.write.removed == ()
    fields = {"rev": "4", "sid": PUBLIC_SID, "pub": first.write.pub}
    decided = probe_anchor("sum", MARGIN, fields, events, "m", 5.0, T0 + 200 * SEC)
    assert decided.outcome is Outcome.PROBED
    write = decided.write
    assert write is not None
    assert (write.expected_rev, write.credited, write.as_of) == ("4", "10", str(T0))
    assert (write.polar, write.removed) == ("1 5 5 5", ("1:e1",))  # e2: within the lag
    assert json.loads(write.pub)["q"] == [5, T0 + 200 * SEC, PROBE_LAG_US]
    # The next reading, not covering the probe, keeps its consumed in p.
    later = {**fields, "rev": "5", "pub": write.pub}
    rest = {k: v for k, v in events.items() if k != "1:e1"}
    again = anchor("sum", MARGIN, later, rest, reading(4, 12, T0 + 199 * SEC))
    assert again.write is not None and again.write.polar == "1 5 5 5"


def test_a_probe_that_cannot_be_used_writes_nothing() -> None:
    first = anchor("count", MARGIN, {}, {}, reading(3, 10, T0))
    assert first.write is not None
    fields = {"rev": "1", "sid": PUBLIC_SID, "pub": first.write.pub}
    low = probe_anchor("count", MARGIN, fields, {}, "m", 2.0, T0 + 100 * SEC)
    assert (low.outcome, low.write) == (Outcome.PROBE_UNUSED, None)
    # A state hash another mode wrote (no public anchor) is never probed into.
    other = {**fields, "sid": "snap-1"}
    assert probe_anchor("count", MARGIN, other, {}, "m", 3.0, T0 + 100 * SEC).write is None
    assert probe_anchor("count", MARGIN, {}, {}, "m", 3.0, T0).write is None
