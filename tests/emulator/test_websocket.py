from __future__ import annotations

import httpx

from outpost_emulator import Emulator
from tests.emulator.helpers import (
    B1500,
    COUNT_ALL,
    MIN_US,
    START_US,
    Ws,
    event,
    ingest_ok,
    reducer_of,
)

EMPTY = {"count": 0, "sum": 0.0, "min": None, "max": None}
LATE = B1500 - MIN_US  # 14:59, a closed bucket: counted at ingest


def test_configuration(emu: Emulator, ws: Ws) -> None:
    ws.send("configuration")
    config = ws.expect("configuration")
    assert config == {
        "organization_id": emu.state()["organization_id"],
        "meters": [],
        "reducers": [],
    }
    ws.conn.send('{"type": "configuration"}')  # payload may be omitted
    ws.expect("configuration")


def test_snapshot_reply(emu: Emulator, ws: Ws) -> None:
    calls = emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    tokens = emu.create_meter("tokens", COUNT_ALL, {"func": "max", "property": "tokens"})
    ws.expect("configuration")
    ws.expect("configuration")
    emu.grant_credits(tokens["id"], 50, external_customer_id="c1")
    snap = ws.snapshot(external_customer_id="c1")
    assert set(snap) == {
        "request_id", "snapshot_id", "external_customer_id", "as_of", "cold_until", "reducers",
        "credited", "aliases",
    }  # fmt: skip
    assert snap["external_customer_id"] == "c1"
    assert snap["as_of"] == START_US
    assert snap["cold_until"] == B1500
    assert snap["reducers"] == {
        reducer_of(emu, calls["id"]): EMPTY,
        reducer_of(emu, tokens["id"]): EMPTY,
    }
    assert snap["credited"] == {calls["id"]: 0, tokens["id"]: 50}


def test_snapshot_by_customer_id_covers_external_id_events(
    emu: Emulator, http: httpx.Client, ws: Ws
) -> None:
    meter = emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ws.expect("configuration")
    customer = emu.create_customer("acme")
    ingest_ok(
        http,
        event(ext="acme", id="x1", at=LATE),
        event(ext=None, customer_id=customer["id"], id="x2", at=LATE),
    )
    by_id = ws.snapshot(customer_id=customer["id"])
    assert by_id["customer_id"] == customer["id"]
    assert "external_customer_id" not in by_id
    assert by_id["reducers"][reducer_of(emu, meter["id"])]["count"] == 2
    assert ws.counted(by_id["snapshot_id"], ["x1", "x2"]) == ["x1", "x2"]
    by_external = ws.snapshot(external_customer_id="acme")
    assert by_external["reducers"] == by_id["reducers"]


def test_a_snapshot_names_the_customers_other_reference_forms(emu: Emulator, ws: Ws) -> None:
    customer = emu.create_customer("acme")
    plain = emu.create_customer()
    by_id = ws.snapshot(customer_id=customer["id"])
    assert by_id["aliases"] == {"external_customer_id": "acme"}
    by_external = ws.snapshot(external_customer_id="acme")
    assert by_external["aliases"] == {"customer_id": customer["id"]}
    assert ws.snapshot(customer_id=plain["id"])["aliases"] == {}
    assert ws.snapshot(external_customer_id="nobody-yet")["aliases"] == {}


def test_a_customer_created_for_a_used_external_id_pushes_its_alias(emu: Emulator, ws: Ws) -> None:
    assert ws.snapshot(external_customer_id="late")["aliases"] == {}
    ws.snapshot(external_customer_id="other")
    customer = emu.create_customer("late")
    pushed = ws.expect("snapshot")
    assert (pushed["request_id"], pushed["external_customer_id"]) == (None, "late")
    assert pushed["aliases"] == {"customer_id": customer["id"]}
    emu.create_customer()  # no external id: no subscriber's customer changed
    ws.sync_point()


def test_unknown_customer_id(ws: Ws) -> None:
    ws.send("snapshot", request_id="r1", customer_id="3b1f9c9e-8f0e-4c1a-9a4e-0d3c2b1a0f9e")
    error = ws.expect("error")
    assert (error["request_id"], error["code"]) == ("r1", "unknown_customer")
    ws.sync_point()


def test_counted_answers(emu: Emulator, http: httpx.Client, ws: Ws) -> None:
    emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ws.expect("configuration")
    ingest_ok(
        http,
        event(id="mine", at=LATE),
        event(id="theirs", ext="c2", at=LATE),
        event(id="hot"),  # current bucket: not counted yet
    )
    snap = ws.snapshot(external_customer_id="c1")
    ingest_ok(http, event(id="after", at=LATE))  # counted after the snapshot was taken
    newer = ws.expect("snapshot")  # pushed for the late "after"
    # The clock is frozen: both snapshots have the same as_of, yet only the newer counts it.
    assert newer["as_of"] == snap["as_of"]
    asked = ["mine", "theirs", "hot", "after", "never-sent", "mine"]
    assert ws.counted(snap["snapshot_id"], asked) == ["mine"]
    assert ws.counted(newer["snapshot_id"], asked) == ["mine", "after"]
    assert ws.counted(newer["snapshot_id"], []) == []


def test_snapshot_expires_after_ten_minutes(emu: Emulator, ws: Ws) -> None:
    snap = ws.snapshot(external_customer_id="c1")
    emu.advance(600)
    assert ws.counted(snap["snapshot_id"], ["e"]) == []
    emu.advance(0.000001)
    ws.send("counted", request_id="late-ask", snapshot_id=snap["snapshot_id"], event_ids=["e"])
    error = ws.expect("error")
    assert (error["request_id"], error["code"]) == ("late-ask", "snapshot_expired")
    ws.send("counted", request_id="r9", snapshot_id="s-never", event_ids=[])
    assert ws.expect("error")["code"] == "snapshot_expired"


def test_too_many_ids(ws: Ws) -> None:
    snap = ws.snapshot(external_customer_id="c1")
    ws.send("counted", request_id="big", snapshot_id=snap["snapshot_id"], event_ids=["e"] * 10_001)
    error = ws.expect("error")
    assert (error["request_id"], error["code"]) == ("big", "too_many_ids")
    assert ws.counted(snap["snapshot_id"], [f"e{i}" for i in range(10_000)]) == []


def test_push_after_a_late_event_and_a_credit(emu: Emulator, http: httpx.Client, ws: Ws) -> None:
    meter = emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ws.expect("configuration")
    ws.snapshot(external_customer_id="c1")
    ingest_ok(http, event(id="late", at=LATE))
    pushed = ws.expect("snapshot")
    assert pushed["request_id"] is None
    assert pushed["external_customer_id"] == "c1"
    assert pushed["reducers"][reducer_of(emu, meter["id"])]["count"] == 1
    assert ws.counted(pushed["snapshot_id"], ["late"]) == ["late"]
    emu.grant_credits(meter["id"], 25, external_customer_id="c1")
    credited = ws.expect("snapshot")
    assert (credited["request_id"], credited["credited"]) == (None, {meter["id"]: 25})
    # Another customer's changes push nothing here.
    ingest_ok(http, event(ext="c2", at=LATE))
    emu.grant_credits(meter["id"], 1, external_customer_id="c2")
    ws.sync_point()


def test_push_reaches_every_subscribed_form_and_connection(
    emu: Emulator, http: httpx.Client, ws: Ws
) -> None:
    emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ws.expect("configuration")
    customer = emu.create_customer("acme")
    ws.snapshot(customer_id=customer["id"])
    with Ws(emu) as other:
        other.snapshot(external_customer_id="acme")
        ingest_ok(http, event(ext="acme", at=LATE))
        assert ws.expect("snapshot")["customer_id"] == customer["id"]
        assert other.expect("snapshot")["external_customer_id"] == "acme"


def test_forget_stops_pushes(emu: Emulator, http: httpx.Client, ws: Ws) -> None:
    emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ws.expect("configuration")
    ws.snapshot(external_customer_id="c1")
    ws.snapshot(external_customer_id="c2")
    ws.send("forget", external_customer_id="c1")
    ws.send("forget", external_customer_id="never-subscribed")
    ws.sync_point()
    assert emu.state()["connections"][0]["subscriptions"] == [{"external_customer_id": "c2"}]
    ingest_ok(http, event(ext="c1", at=LATE))  # no push for c1 any more
    ingest_ok(http, event(ext="c2", at=LATE))
    assert ws.expect("snapshot")["external_customer_id"] == "c2"


def test_pings_are_answered(ws: Ws) -> None:
    assert ws.conn.ping(b"outpost").wait(timeout=5)
    ws.sync_point()


def test_state_lists_sockets(emu: Emulator, ws: Ws) -> None:
    ws.snapshot(external_customer_id="c1")
    (connection,) = emu.state()["connections"]
    assert connection["subscriptions"] == [{"external_customer_id": "c1"}]
    assert connection["frames_in"] == 1
