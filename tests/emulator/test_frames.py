"""Malformed client frames get an `error` frame; the socket stays open and usable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from outpost_emulator import Emulator
from tests.emulator.helpers import Ws

UUID = "3b1f9c9e-8f0e-4c1a-9a4e-0d3c2b1a0f9e"


def frame(type_: Any, **payload: Any) -> str:
    return json.dumps({"type": type_, "payload": payload})


CASES: list[tuple[str | bytes, str, str | None]] = [
    (b'{"type": "configuration"}', "invalid_frame", None),  # binary
    ("{not json", "invalid_frame", None),
    ('{"type": "configuration", "payload": NaN}', "invalid_frame", None),
    ("[1, 2]", "invalid_frame", None),
    ('"configuration"', "invalid_frame", None),
    ("42", "invalid_frame", None),
    ("", "invalid_frame", None),
    ('{"payload": {"request_id": "r1"}}', "invalid_frame", "r1"),  # no type
    ('{"type": 7, "payload": {"request_id": "r2"}}', "invalid_frame", "r2"),
    (frame("subscribe", request_id="r3"), "unknown_type", "r3"),
    (frame("error", request_id="r4"), "unknown_type", "r4"),
    ('{"type": "snapshot", "payload": [1]}', "invalid_payload", None),
    ('{"type": "snapshot", "payload": "c1"}', "invalid_payload", None),
    (frame("snapshot", external_customer_id="c1"), "invalid_payload", None),  # no request_id
    (frame("snapshot", request_id=5, external_customer_id="c1"), "invalid_payload", None),
    (frame("snapshot", request_id="r5"), "invalid_payload", "r5"),  # no identity
    (
        frame("snapshot", request_id="r6", external_customer_id="c1", customer_id=UUID),
        "invalid_payload",
        "r6",
    ),
    (frame("snapshot", request_id="r7", external_customer_id=12), "invalid_payload", "r7"),
    (frame("snapshot", request_id="r8", customer_id="not-a-uuid"), "invalid_payload", "r8"),
    (frame("snapshot", request_id="r9", customer_id=UUID), "unknown_customer", "r9"),
    (frame("counted", request_id="r10", event_ids=["e"]), "invalid_payload", "r10"),
    (frame("counted", request_id="r11", snapshot_id="s", event_ids="e"), "invalid_payload", "r11"),
    (frame("counted", request_id="r12", snapshot_id="s", event_ids=[1]), "invalid_payload", "r12"),
    (frame("counted", request_id="r13", snapshot_id=1, event_ids=[]), "invalid_payload", "r13"),
    (frame("counted", snapshot_id="s-1", event_ids=[]), "invalid_payload", None),
    (frame("forget"), "invalid_payload", None),
    (frame("forget", customer_id=42), "invalid_payload", None),
]  # fmt: skip


@pytest.fixture(scope="module")
def shared_ws(shared_emu: Emulator) -> Iterator[Ws]:
    with Ws(shared_emu) as client:
        yield client


@pytest.mark.parametrize(("data", "code", "request_id"), CASES)
def test_malformed_frame_gets_an_error(
    shared_emu: Emulator, shared_ws: Ws, data: str | bytes, code: str, request_id: str | None
) -> None:
    rejected = shared_emu.state()["counters"].get("ws_frames_rejected", 0)
    shared_ws.send_raw(data)
    error = shared_ws.expect("error")
    assert error["code"] == code
    assert error["request_id"] == request_id
    assert isinstance(error["message"], str) and error["message"]
    shared_ws.sync_point()  # still open, still answering
    assert shared_emu.state()["counters"]["ws_frames_rejected"] == rejected + 1


def test_huge_frame(emu: Emulator, ws: Ws) -> None:
    padding = "x" * (1024 * 1024)
    ws.send_raw(frame("configuration", request_id="big", padding=padding))
    error = ws.expect("error")
    assert error["code"] == "invalid_frame"
    assert "larger" in error["message"]
    ws.sync_point()


def test_a_frame_of_exactly_one_mebibyte_is_fine(ws: Ws) -> None:
    base = frame("configuration", pad="")
    ws.send_raw(frame("configuration", pad="x" * (1024 * 1024 - len(base))))
    ws.expect("configuration")


def test_a_burst_of_garbage_then_real_work(emu: Emulator, ws: Ws) -> None:
    for data, _, _ in CASES:
        ws.send_raw(data)
    for _ in CASES:
        ws.expect("error")
    snap = ws.snapshot(external_customer_id="c1")
    assert ws.counted(snap["snapshot_id"], []) == []
    assert emu.state()["counters"]["ws_frames_rejected"] == len(CASES)
