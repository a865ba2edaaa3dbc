"""One table of track() rules (conformance/events.json), run against Outpost's validator and the
emulator's ingestion validation: an event Outpost accepts is one Polar accepts, and every event
Polar refuses, Outpost refuses (the TypeScript core runs the same table in its own tests)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from outpost_core import InvalidEvent
from outpost_core._event import build_event, customer_of, event_id_of
from outpost_emulator._customers import Customers
from outpost_emulator._validation import validate_ingest

VECTORS: list[dict[str, Any]] = json.loads(
    (pathlib.Path(__file__).parents[2] / "conformance" / "events.json").read_text()
)["vectors"]
NOW_US = 1_796_223_600_000_000


def outpost_decides(event: dict[str, Any]) -> str:
    try:
        build_event(
            event_id=event_id_of(event["external_id"], "unused"),
            name=event["name"],
            customer=customer_of(event.get("external_customer_id"), event.get("customer_id")),
            metadata=event["metadata"],
            timestamp_us=NOW_US,
        )
    except InvalidEvent:
        return "refuse"
    return "accept"


def polar_decides(event: dict[str, Any]) -> str:
    # As Polar reads it: the JSON the client sends, parsed again.
    body = json.loads(json.dumps({"events": [event]}))
    events, errors = validate_ingest(body, NOW_US, Customers())
    return "accept" if events and not len(errors) else "refuse"


@pytest.mark.parametrize("vector", VECTORS, ids=[v["rule"] for v in VECTORS])
def test_outpost_decides_as_the_table_says(vector: dict[str, Any]) -> None:
    assert outpost_decides(vector["event"]) == vector["outpost"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["rule"] for v in VECTORS])
def test_the_emulator_decides_as_polar_does(vector: dict[str, Any]) -> None:
    if vector["polar"] == "unsendable":
        with pytest.raises(UnicodeEncodeError):
            json.dumps(vector["event"], ensure_ascii=False).encode()
        return
    assert polar_decides(vector["event"]) == vector["polar"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["rule"] for v in VECTORS])
def test_what_outpost_accepts_polar_accepts(vector: dict[str, Any]) -> None:
    assert vector["outpost"] == "refuse" or vector["polar"] == "accept"
    assert vector["polar"] != "refuse" or vector["outpost"] == "refuse"
