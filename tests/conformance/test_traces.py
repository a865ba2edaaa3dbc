"""Every checked-in trace (conformance/traces/, recorded from real runs of the sync driver by
``python -m conformance.record_traces``) replays through a fresh core with no mismatch."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from outpost_core.traces import replay_delivery, replay_session

TRACES = Path(__file__).resolve().parents[2] / "conformance" / "traces"
SCENARIOS = {
    "first_read_and_not_ready",
    "pushed_snapshot",
    "acknowledge_hot_and_cold",
    "dropped_batch",
    "reconnect",
    "revision_gap_reload",
    "split_422",
    "forged_changes",
}
FILES = sorted(TRACES.glob("*/*/*.jsonl"))


def test_every_scenario_has_traces() -> None:
    assert {path.parts[-3] for path in FILES} == SCENARIOS
    for scenario in SCENARIOS:
        assert (TRACES / scenario / "a" / "session.jsonl").exists()


@pytest.mark.parametrize("path", FILES, ids=lambda p: "/".join(p.parts[-3:]))
def test_a_trace_replays_through_a_fresh_core(path: Path) -> None:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    replay = replay_session if records[0]["machine"] == "session" else replay_delivery
    assert replay(records, random.Random) == []


def received(scenario: str, kind: str = "BytesReceived") -> bytes:
    """Every byte Polar sent in a scenario's session trace (or Redis, with ``ChangePublished``)."""
    out = b""
    for line in (TRACES / scenario / "a" / "session.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("t") == "input" and record["input"]["$kind"] == kind:
            out += bytes.fromhex(record["input"]["data"]["$bytes"])
    return out


def test_the_traces_hold_what_their_scenario_is_about() -> None:
    def kinds(scenario: str, name: str = "session.jsonl", who: str = "a") -> str:
        return (TRACES / scenario / who / name).read_text()

    first = kinds("first_read_and_not_ready")
    assert '"method":"read"' in first and '"result":null' in first  # not ready yet, then...
    assert '"$kind":"Balance"' in first
    assert b'"request_id":null' in received("pushed_snapshot")  # a push, not an answer
    assert '"script":"acknowledge"' in kinds("acknowledge_hot_and_cold", "delivery-0.jsonl")
    assert '"ReportDropped"' in kinds("dropped_batch", "delivery-0.jsonl")
    assert kinds("reconnect").count('"OpenConnection"') >= 2
    assert kinds("revision_gap_reload", who="b").count('"LoadIdentity"') >= 2
    assert '"status":422' in kinds("split_422", "delivery-0.jsonl")
    forged = received("forged_changes", "ChangePublished")
    assert all(text in forged for text in (b'"full": true', b'"d": null', b'"x y z"'))
    assert kinds("forged_changes").count('"LoadIdentity"') >= 2  # the first load, the reload
