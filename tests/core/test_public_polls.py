"""Poll planning: who to ask Polar about, batched within 100 rows, paced by the budget."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outpost_core._public_polls import (
    MAX_ROWS,
    PROBE_SPAN_US,
    CustomerMetersRequest,
    Followed,
    PollPlanner,
    QuantitiesProbe,
)
from outpost_core.errors import UsageError

S = 1_000_000
T0 = 1_800_000_000 * S


def view(customer: str, meter: str = "m1", **kw: object) -> Followed:
    fields: dict[str, object] = {"aggregation": "count", "balance": 100.0, "pending_events": 0}
    fields.update(kw)
    return Followed(customer, meter, **fields)  # type: ignore[arg-type]


def test_misuse() -> None:
    with pytest.raises(UsageError):
        PollPlanner(0)
    with pytest.raises(UsageError):
        PollPlanner(60, retry_s=0)


def test_request_params() -> None:
    request = CustomerMetersRequest(("a", "b"), ("m1",))
    assert request.params() == (
        ("external_customer_id", "a"),
        ("external_customer_id", "b"),
        ("meter_id", "m1"),
        ("limit", "100"),
    )


def test_never_reported_first_then_paced() -> None:
    planner = PollPlanner(per_minute=60)  # a bucket of 4
    views = [view(f"c{n}", meter) for n in range(300) for meter in ("m1", "m2")]
    for v in views:
        planner.follow(v.customer, v.meter_id, T0)
    planner.follow("c0", "m1", T0 + 5)  # following again keeps the first time
    plan = planner.plan(T0, views)
    assert [len(r.external_customer_ids) for r in plan.polls] == [50, 50, 50, 50]
    assert all(r.meter_ids == ("m1", "m2") for r in plan.polls)
    assert planner.plan(T0, views).polls == ()  # the bucket is empty
    # Two more a second later (60 a minute); the ones asked wait for `retry_s`.
    again = planner.plan(T0 + 2 * S, views)
    assert [r.external_customer_ids[0] for r in again.polls] == ["c200", "c250"]
    later = planner.plan(T0 + 12 * S, views)
    assert later.polls[0].external_customer_ids[0] == "c0"  # asked 12 s ago, never answered


def test_reported_ones_are_polled_when_stale() -> None:
    planner = PollPlanner(per_minute=600, poll_every_s=300)
    views = [view("a"), view("b"), view("gone")]
    for v in views[:2]:
        planner.follow(v.customer, v.meter_id, T0)
    planner.heard("a", "m1", T0)
    planner.heard("b", "m1", T0 + 100 * S)
    assert planner.plan(T0 + 299 * S, views).polls == ()
    assert planner.plan(T0 + 300 * S, views).polls == (CustomerMetersRequest(("a",), ("m1",)),)
    assert planner.plan(T0 + 301 * S, views).polls == ()  # asked: not again at once
    assert planner.plan(T0 + 400 * S, views).polls == (CustomerMetersRequest(("b",), ("m1",)),)
    planner.unfollow("a", "m1")
    assert planner.plan(T0 + 1000 * S, views).polls == (CustomerMetersRequest(("b",), ("m1",)),)


def test_probes() -> None:
    planner = PollPlanner(per_minute=600, probe_band=5)
    views = [
        view("low", balance=5.0),
        view("busy", pending_events=3, window_start_us=T0 - 100 * S),
        view("quiet", pending_events=0),
        view("maxed", aggregation="max", balance=0.0),
        view("unknown", balance=None),
        view("unheard", balance=0.0),
    ]
    for v in views:
        planner.follow(v.customer, v.meter_id, T0)
        if v.customer != "unheard":
            planner.heard(v.customer, v.meter_id, T0)
    plan = planner.plan(T0 + 1 * S, views)
    assert plan.probes == (
        QuantitiesProbe("low", "m1", T0 + S - PROBE_SPAN_US, T0 + S + 86_400 * S),
    )
    plan = planner.plan(T0 + 600 * S, views)
    assert [p.customer for p in plan.probes] == ["low", "busy"]
    assert plan.probes[1].start_us == T0 - 100 * S
    assert planner.plan(T0 + 630 * S, views).probes == ()  # probed 30 s ago


def test_customers_named_by_polars_id_are_asked_by_customer_id() -> None:
    planner = PollPlanner(per_minute=600)
    views = [view("a"), view("u1", kind="customer"), view("b"), view("u2", kind="customer")]
    for v in views:
        planner.follow(v.customer, v.meter_id, T0, v.kind)
    plan = planner.plan(T0, views)
    # Polar ANDs its filters: one request per kind, the first-followed first.
    assert plan.polls == (
        CustomerMetersRequest(("a", "b"), ("m1",)),
        CustomerMetersRequest((), ("m1",), ("u1", "u2")),
    )
    assert plan.polls[1].params() == (
        ("customer_id", "u1"),
        ("customer_id", "u2"),
        ("meter_id", "m1"),
        ("limit", "100"),
    )
    assert plan.polls[1].kind == "customer" and plan.polls[0].kind == "external"
    assert planner.plan(T0 + 5 * S, views).polls == ()  # asked, each under its kind
    planner.heard("u1", "m1", T0 + 5 * S, "customer")
    planner.heard("u1", "m1", T0 + 5 * S)  # the same name as an external id: another customer
    assert ("customer", "u1", "m1") in planner.heard_at and (
        "external",
        "u1",
        "m1",
    ) in planner.heard_at
    planner.unfollow("u1", "m1", "customer")
    assert ("customer", "u1", "m1") not in planner.heard_at
    low = view("u3", balance=0.0, kind="customer")
    planner.follow("u3", "m1", T0, "customer")
    planner.heard("u3", "m1", T0, "customer")
    [probe] = planner.plan(T0 + 20 * S, [low]).probes
    assert (probe.customer, probe.kind) == ("u3", "customer")


@given(
    pairs=st.lists(
        st.tuples(st.integers(0, 400), st.integers(0, 150), st.booleans()),
        min_size=1,
        max_size=500,
        unique=True,
    )
)
def test_batches_never_exceed_100_rows_and_cover_everything(
    pairs: list[tuple[int, int, bool]],
) -> None:
    views = [view(f"c{c}", f"m{m}", kind="customer" if k else "external") for c, m, k in pairs]
    requests = PollPlanner._batches(views)
    for request in requests:
        assert len(request.customers) * len(request.meter_ids) <= MAX_ROWS
        assert not (request.external_customer_ids and request.customer_ids)  # one kind each
    covered = {(r.kind, c, m) for r in requests for c in r.customers for m in r.meter_ids}
    assert {v.key for v in views} <= covered
