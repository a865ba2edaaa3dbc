"""The reducer pipeline on a frozen clock: current bucket, close-sync, late events, seals,
generations and cold_until."""

from __future__ import annotations

from typing import Any

import httpx

from outpost_emulator import Emulator, EmulatorClock
from tests.emulator.helpers import (
    B1500,
    BUCKET_US,
    COUNT_ALL,
    MIN_US,
    START,
    START_US,
    Ws,
    auth,
    event,
    ingest_ok,
)

SEC = 1_000_000


def rows(emu: Emulator) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = emu.state()["pipeline"]["rows"]
    return result


def status(emu: Emulator) -> dict[str, int]:
    events = emu.state()["events"]
    return {k: events[k] for k in ("current", "waiting", "counted")}


def advance_to(emu: Emulator, t_us: int) -> None:
    now = emu.state()["now_us"]
    assert t_us >= now
    emu.advance((t_us - now) / SEC)


def test_current_bucket_waits_for_the_close_sync(emu: Emulator, http: httpx.Client, ws: Ws) -> None:
    emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ws.expect("configuration")
    ingest_ok(http, event(id="e1"))
    assert status(emu) == {"current": 1, "waiting": 0, "counted": 0}
    snap = ws.snapshot(external_customer_id="c1")
    assert snap["cold_until"] == B1500
    assert next(iter(snap["reducers"].values()))["count"] == 0
    assert ws.counted(snap["snapshot_id"], ["e1"]) == []

    advance_to(emu, B1500 + BUCKET_US + 9 * SEC)  # closed, but the sync is 10 s later
    assert status(emu)["current"] == 1
    assert emu.state()["cold_until"] == B1500

    emu.advance(1)
    assert status(emu) == {"current": 0, "waiting": 0, "counted": 1}
    assert emu.state()["cold_until"] == B1500 + BUCKET_US
    (row,) = rows(emu)
    assert (row["bucket_start"], row["generation"], row["sealed"]) == (B1500, 1, False)
    assert row["counted"] == {"count": 1, "sum": 1.0, "min": 1.0, "max": 1.0}
    pushed = ws.expect("snapshot")  # the sync moved c1's events
    assert pushed["request_id"] is None
    assert next(iter(pushed["reducers"].values()))["count"] == 1
    assert ws.counted(pushed["snapshot_id"], ["e1"]) == ["e1"]
    assert ws.counted(snap["snapshot_id"], ["e1"]) == []  # the old snapshot did not count it


def test_late_event_is_counted_at_ingest(emu: Emulator, http: httpx.Client) -> None:
    emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ingest_ok(http, event(id="late", at=B1500 - 8 * MIN_US))  # 14:52, a closed bucket
    assert status(emu) == {"current": 0, "waiting": 0, "counted": 1}
    (row,) = rows(emu)
    assert row["bucket_start"] == B1500 - 2 * BUCKET_US
    assert row["event_ids"] == ["late"]


def test_late_event_in_the_previous_bucket_before_its_sync(
    emu: Emulator, http: httpx.Client, ws: Ws
) -> None:
    emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ws.expect("configuration")
    advance_to(emu, B1500 + BUCKET_US + 5 * SEC)  # 15:05:05
    ingest_ok(http, event(id="t-1", at=B1500 + 4 * MIN_US))  # 15:04: T-1, not synced yet
    assert status(emu)["counted"] == 1  # in its Postgres row at once...
    snap = ws.snapshot(external_customer_id="c1")
    assert snap["cold_until"] == B1500  # ...but its bucket is not cold yet
    assert ws.counted(snap["snapshot_id"], ["t-1"]) == []
    emu.advance(5)
    later = ws.snapshot(external_customer_id="c1")
    assert later["cold_until"] == B1500 + BUCKET_US
    assert ws.counted(later["snapshot_id"], ["t-1"]) == ["t-1"]


def test_seal_and_new_generation(emu: Emulator, http: httpx.Client, ws: Ws) -> None:
    meter = emu.create_meter("tokens", COUNT_ALL, {"func": "sum", "property": "tokens"})
    ws.expect("configuration")
    b1450 = B1500 - 2 * BUCKET_US
    ingest_ok(http, event(id="a", at=b1450 + MIN_US, tokens=1))
    advance_to(emu, b1450 + BUCKET_US + 11 * MIN_US - 1)  # 15:05:59.999999
    assert [r["sealed"] for r in rows(emu)] == [False]
    emu.advance(0.000001)  # 11 minutes after the bucket's end
    assert [r["sealed"] for r in rows(emu)] == [True]

    ingest_ok(http, event(id="b", at=b1450 + 2 * MIN_US, tokens=10))
    ingest_ok(http, event(id="c", at=b1450 + 3 * MIN_US, tokens=100))
    by_generation = {r["generation"]: r for r in rows(emu) if r["bucket_start"] == b1450}
    assert by_generation[1]["event_ids"] == ["a"]
    assert by_generation[1]["sealed"]
    assert by_generation[2]["event_ids"] == ["b", "c"]
    assert not by_generation[2]["sealed"]

    snap = ws.snapshot(external_customer_id="c1")
    reducer_total = snap["reducers"][emu.state()["reducers"][0]["id"]]
    assert reducer_total == {"count": 3, "sum": 111.0, "min": 1.0, "max": 100.0}
    assert emu.customer_meter(meter["id"], external_customer_id="c1")["consumed_units"] == 111.0


def test_pause_keeps_events_waiting_and_cold_until_looks_back_one_hour(
    emu: Emulator, http: httpx.Client, ws: Ws
) -> None:
    emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ws.expect("configuration")
    emu.fault_pause_syncs()
    ingest_ok(http, event(id="now"))  # current bucket 15:00
    emu.advance(2 * 3600)  # 17:02, no sync ran
    assert status(emu) == {"current": 1, "waiting": 0, "counted": 0}
    hour_ago = B1500 + 2 * 3600 * SEC - 3600 * SEC  # floor(17:02) - 1 h = 16:00
    assert emu.state()["cold_until"] == hour_ago
    ingest_ok(http, event(id="late", at=B1500 + 90 * MIN_US))  # 16:30, closed: waits
    assert status(emu) == {"current": 1, "waiting": 1, "counted": 0}
    snap = ws.snapshot(external_customer_id="c1")
    assert snap["cold_until"] == hour_ago
    assert next(iter(snap["reducers"].values()))["count"] == 0
    assert ws.counted(snap["snapshot_id"], ["now", "late"]) == []

    emu.fault_resume_syncs()
    assert status(emu) == {"current": 0, "waiting": 0, "counted": 2}
    pushed = ws.expect("snapshot")
    assert pushed["request_id"] is None
    assert pushed["cold_until"] == B1500 + 2 * 3600 * SEC  # 17:00
    assert next(iter(pushed["reducers"].values()))["count"] == 2
    assert ws.counted(pushed["snapshot_id"], ["now", "late"]) == ["now", "late"]


def test_a_waiting_event_holds_cold_until_at_its_bucket(emu: Emulator, http: httpx.Client) -> None:
    emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    advance_to(emu, B1500 + 20 * MIN_US)  # 15:20: synced through 15:15
    assert emu.state()["cold_until"] == B1500 + 15 * MIN_US
    emu.fault_pause_syncs()
    ingest_ok(http, event(id="late", at=B1500 + 11 * MIN_US))  # bucket 15:10 waits
    assert emu.state()["cold_until"] == B1500 + 10 * MIN_US
    emu.advance(20 * 60)
    assert emu.state()["cold_until"] == B1500 + 10 * MIN_US
    # Nothing after a waiting event seals either.
    assert emu.state()["pipeline"]["sealed_until"] <= B1500 + 10 * MIN_US
    emu.fault_resume_syncs()
    # 15:40:00: the bucket 15:35 closed but syncs at 15:40:10.
    assert emu.state()["cold_until"] == B1500 + 35 * MIN_US


def test_sync_delay_is_configurable() -> None:
    with Emulator.start(clock=EmulatorClock(START, frozen=True), sync_delay=0) as emu:
        emu.create_meter("calls", COUNT_ALL, {"func": "count"})
        with httpx.Client(base_url=emu.url, headers=auth(emu.token), verify=False) as http:
            ingest_ok(http, event(id="e"))
        emu.advance((B1500 + BUCKET_US - START_US) / SEC)
        assert emu.state()["events"]["counted"] == 1
        assert emu.state()["cold_until"] == B1500 + BUCKET_US


def test_meter_created_later_sees_counted_events(emu: Emulator, http: httpx.Client, ws: Ws) -> None:
    ingest_ok(http, event(id="old", at=B1500 - MIN_US, tokens=4))
    emu.create_meter("tokens", COUNT_ALL, {"func": "sum", "property": "tokens"})
    ws.expect("configuration")
    snap = ws.snapshot(external_customer_id="c1")
    assert next(iter(snap["reducers"].values()))["sum"] == 4.0
    assert ws.counted(snap["snapshot_id"], ["old"]) == ["old"]


def test_events_that_match_no_reducer_are_still_counted(
    emu: Emulator, http: httpx.Client, ws: Ws
) -> None:
    emu.create_meter("tokens", COUNT_ALL, {"func": "sum", "property": "tokens"})
    ws.expect("configuration")
    ingest_ok(http, event(id="no-tokens", at=B1500 - MIN_US))
    snap = ws.snapshot(external_customer_id="c1")
    assert next(iter(snap["reducers"].values())) == {
        "count": 0,
        "sum": 0.0,
        "min": None,
        "max": None,
    }
    # Polar processed it and will never add it to this reducer: it is counted.
    assert ws.counted(snap["snapshot_id"], ["no-tokens"]) == ["no-tokens"]


def test_running_clock_syncs_in_the_background() -> None:
    # Speed 600: a 5-minute bucket closes within about half a second of wall time.
    clock = EmulatorClock(START, speed=600)
    with Emulator.start(clock=clock, sync_delay=1) as emu:
        emu.create_meter("calls", COUNT_ALL, {"func": "count"})
        with httpx.Client(base_url=emu.url, headers=auth(emu.token), verify=False) as http:
            ingest_ok(http, event(id="e"))
        from tests.emulator.helpers import wait_for

        wait_for(lambda: emu.state()["events"]["counted"] == 1, "the background sync")
