"""`outpost inspect`'s report and its explanation, without I/O."""

from __future__ import annotations

from typing import Any

import pytest

from outpost_core import Customer, parse_configuration
from outpost_core._inspect import PendingEvent, events_keys, explain, inspection, parse_events
from tests.support.payloads import configuration, reducer

NOW = 1_800_000_000_000_000
BUCKET = 1_799_999_700_000_000
CONFIGURATION = configuration(
    reducer("r1", ["m1"], func="sum", prop="tokens"), reducer("r2", ["m2"])
)
C1 = Customer("external", "c1")
STATE = {
    "rev": "7",
    "cu": str(BUCKET),
    "sa": str(NOW - 2_000_000),
    "sid": "s-1",
    "p": "2 10 4 6",
    "c:m1": "100",
    "c:m2": "5",
    f"a:{BUCKET}": "2 5 2 3",
    "n": "2",
    "u": "1",
}
EVENTS = {f"{BUCKET}:e1": "2", f"{BUCKET}:e2": f"3 {NOW - 1_000_000}"}


def reducer_of(meter: str) -> Any:
    found = parse_configuration(CONFIGURATION).reducer_for(meter)
    assert found is not None
    return found


def report(polar: dict[str, Any] | None, meter: str = "m1", **fields: Any) -> dict[str, Any]:
    return inspection(
        meter_id=meter,
        customer=C1,
        reducer=reducer_of(meter),
        state_fields=fields.get("state", STATE),
        event_fields=fields.get("events", EVENTS),
        now_us=NOW,
        polar_meter=polar,
    )


def test_the_events_hashes_are_those_the_state_hash_indexes() -> None:
    state = {"rev": "3", "a:600000000": "1 1 1 1", "a:300000000": "2 2 1 1", "a:x": "", "n": "3"}
    assert events_keys("st", state) == ["st:ev:300000000", "st:ev:600000000"]
    assert events_keys("st", {}) == []


def test_parse_events_sorts_and_names_what_it_cannot_read() -> None:
    events, problems = parse_events(
        {
            f"{BUCKET + 300_000_000}:b": "1",
            f"{BUCKET}:a": f"2 {NOW}",
            "x:y": "1",
            f"{BUCKET}:": "1",
            f"{BUCKET}:c": "nan?",
            f"{BUCKET}:d": "1 later",
        }
    )
    assert [e.event_id for e in events] == ["a", "b"]
    assert events[0] == PendingEvent("a", BUCKET, 2.0, NOW)
    assert len(problems) == 4


def test_the_local_side_of_the_report() -> None:
    data = report({"consumed_units": 15, "credited_units": 100, "balance": 85})
    local = data["local"]
    assert (local["balance"], local["credited"], local["consumed"]) == (85, 100, 15)
    assert local["polar_part"] == {"count": 2, "sum": 10, "min": 4, "max": 6}
    assert local["local_part"] == {"count": 2, "sum": 5, "min": 2, "max": 3}
    assert (local["pending"], local["undelivered"], local["revision"]) == (2, 1, 7)
    assert local["snapshot_age_s"] == 2.0 and local["snapshot_id"] == "s-1"
    assert data["buckets"] == [
        {"start": "2027-01-15T07:55:00+00:00", "count": 2, "sum": 5, "min": 2, "max": 3}
    ]
    assert [e["acknowledged"] for e in data["pending_events"]] == [False, True]
    assert data["pending_events"][1]["acknowledged_age_s"] == 1.0
    assert data["difference"]["verdict"] == "same"


def test_open_holds_are_listed_and_only_live_ones_held() -> None:
    state = {**STATE, "h:r1": f"3 {NOW + 5_000_000}", "h:r0": f"2 {NOW}", "h:bad": "x"}
    data = report(None, state=state)
    assert (data["local"]["held"], data["local"]["available"]) == (3, 82)
    assert data["holds"] == [
        {"hold_id": "r0", "units": 2, "expires": "2027-01-15T08:00:00+00:00",
         "expires_in_s": 0.0, "expired": True},
        {"hold_id": "r1", "units": 3, "expires": "2027-01-15T08:00:05+00:00",
         "expires_in_s": 5.0, "expired": False},
    ]  # fmt: skip
    assert "h:bad='x'" in data["unreadable_fields"]


def test_no_snapshot_yet() -> None:
    data = report(None, state={"rev": "1"}, events={})
    assert data["local"]["cold_until"] is None and data["local"]["snapshot_age_s"] is None
    assert data["polar"] is None and data["difference"]["verdict"] == "unknown"


@pytest.mark.parametrize(
    ("meter", "consumed", "credited", "verdict", "says"),
    [
        ("m1", 13, 100, "safe", "The 1 undelivered events account for all of it."),
        ("m1", 10, 100, "safe", "The 2 pending events account for all of it."),
        ("m1", 14, 100, "safe", "1 events are undelivered and 1 acknowledged"),
        ("m2", 3, 5, "safe", "The 1 undelivered events account for all of it."),
        ("m1", 20, 100, "above_polar", "BELOW Polar's"),
        ("m1", 15, 50, "above_polar", "Credits differ (local 100, Polar 50)"),
        ("m1", 15, 150, "same", "Credits differ (local 100, Polar 150)"),
    ],
)
def test_the_difference_with_polar_is_explained(
    meter: str, consumed: float, credited: float, verdict: str, says: str
) -> None:
    polar = {"consumed_units": consumed, "credited_units": credited, "balance": credited - consumed}
    difference = report(polar, meter=meter)["difference"]
    assert difference["verdict"] == verdict
    assert says in difference["text"]


def test_count_meters_count_events() -> None:
    data = report({"consumed_units": 3, "credited_units": 5, "balance": 2}, meter="m2")
    assert data["local"]["consumed"] == 4


def test_polar_numbers_that_are_not_numbers() -> None:
    data = report({"consumed_units": "x", "credited_units": True, "balance": None})
    assert data["polar"] == {"credited": None, "consumed": None, "balance": None}
    assert explain("sum", 1.0, 1.0, [], data["polar"])["verdict"] == "unknown"
    partial = explain("sum", 1.0, 1.0, [], {"consumed": 1.0, "credited": None, "balance": None})
    assert partial["verdict"] == "same"


def test_unreadable_fields_are_listed() -> None:
    data = report(None, state={**STATE, "n": "many"}, events={"junk": "1"})
    assert data["unreadable_fields"] == ["junk='1'", "n='many'"]
