"""Polar's customer meters read from webhook bodies and customer-meters pages: bad input is a
counted rejection, never an exception."""

from __future__ import annotations

import json
from typing import Any

import pytest

from outpost_core._public_readings import (
    MAX_BODY_BYTES,
    PolarReading,
    parse_customer_meters,
    parse_state_changed,
)

ROW = {
    "meter_id": "m1",
    "consumed_units": 2.5,
    "credited_units": 10,
    "balance": 7.5,
    "modified_at": "2026-12-02T15:02:00Z",
}
WHEN = 1_796_223_720_000_000


def hook(rows: list[Any], **data: Any) -> bytes:
    state: dict[str, Any] = {"external_id": "acme", "id": "u1", **data, "active_meters": rows}
    return json.dumps({"type": "customer.state_changed", "data": state}).encode()


def test_state_changed() -> None:
    readings, rejected = parse_state_changed(
        hook([ROW, {**ROW, "meter_id": "m2", "modified_at": None}])
    )
    assert rejected == []
    assert readings == [
        PolarReading("acme", "u1", "m1", 2.5, 10, 7.5, WHEN),
        PolarReading("acme", "u1", "m2", 2.5, 10, 7.5, None),
    ]


def test_state_changed_says_where_each_meter_window_began() -> None:
    subscriptions = [
        {"current_period_start": "2026-12-01T00:00:00Z", "meters": [{"meter_id": "m1"}]},
        {"current_period_start": "2026-12-02T00:00:00Z", "meters": [{"meter_id": "m1"}, 3]},
        {"current_period_start": "2026-11-01T00:00:00Z", "meters": [{"meter_id": "m1"}]},
        {"current_period_start": None, "meters": [{"meter_id": "m2"}]},
        {"current_period_start": "later", "meters": []},
        {"current_period_start": "2026-12-01T00:00:00Z", "meters": "m2"},
        "x",
    ]
    body = hook([ROW, {**ROW, "meter_id": "m2"}], active_subscriptions=subscriptions)
    readings, rejected = parse_state_changed(body)
    # m1: the latest period start of the subscriptions carrying it (2026-12-02T00:00:00Z).
    assert [r.reset_at_us for r in readings] == [WHEN - 15 * 3_600_000_000 - 120_000_000, None]
    assert [r.reason for r in rejected] == ["a subscription without its period start or meters"] * 4
    assert parse_state_changed(hook([ROW], active_subscriptions="x"))[0][0].reset_at_us is None


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("x", "not an object"),
        ({**ROW, "meter_id": 3}, "meter_id"),
        ({**ROW, "consumed_units": "2"}, "finite number"),
        ({**ROW, "balance": True}, "finite number"),
        ({**ROW, "credited_units": 1e400}, "finite number"),
        ({**ROW, "credited_units": 1.5}, "whole"),
        ({**ROW, "modified_at": 5}, "not a string"),
        ({**ROW, "modified_at": "yesterday"}, "ISO"),
        ({**ROW, "modified_at": "2026-12-02T15:02:00"}, "ISO"),
    ],
)
def test_bad_rows_are_rejected_one_by_one(row: Any, reason: str) -> None:
    readings, rejected = parse_state_changed(hook([row, ROW]))
    assert len(readings) == 1
    assert len(rejected) == 1 and reason in rejected[0].reason


def test_bad_bodies() -> None:
    assert parse_state_changed(b"{")[1][0].reason.startswith("not JSON")
    assert parse_state_changed(b"[" * 100_000)[1][0].reason.startswith("not JSON")
    assert parse_state_changed(b"9" * 5000)[1][0].reason.startswith("not JSON")
    assert "bytes" in parse_state_changed(b" " * (MAX_BODY_BYTES + 1))[1][0].reason
    assert parse_state_changed(json.dumps({"type": "order.paid"}).encode()) == ([], [])
    assert parse_state_changed(b"[]") == ([], [])
    no_meters = json.dumps({"type": "customer.state_changed", "data": {}}).encode()
    assert parse_state_changed(no_meters)[1][0].reason.startswith("customer.state_changed")
    bad_data = json.dumps({"type": "customer.state_changed", "data": []}).encode()
    assert parse_state_changed(bad_data)[1]
    no_customer = hook([ROW], external_id=None, id=None)
    assert "no customer" in parse_state_changed(no_customer)[1][0].reason


def test_customer_meters_page() -> None:
    items = [
        {**ROW, "customer_id": "u1", "customer": {"external_id": "acme"}},
        {**ROW, "customer_id": None, "customer": None, "external_customer_id": "ext"},
        {**ROW, "customer_id": "u2", "customer": {"external_id": None}},
        "junk",
    ]
    readings, rejected = parse_customer_meters(json.dumps({"items": items}).encode())
    assert [(r.external_customer_id, r.customer_id) for r in readings] == [
        ("acme", "u1"),
        ("ext", None),
        (None, "u2"),
    ]
    assert len(rejected) == 1
    assert parse_customer_meters(b"nope")[1]
    assert parse_customer_meters(b"{}")[1][0].reason.endswith("without items")
    assert parse_customer_meters(b"[]")[1]
