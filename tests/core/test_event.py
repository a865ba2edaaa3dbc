"""Validation of track() input (``_event``): what Polar's ingestion would refuse, refused here."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from outpost_core import Customer, InvalidEvent
from outpost_core._event import (
    MAX_CUSTOMER_ID,
    MAX_EVENT_ID,
    MAX_NAME,
    MAX_STRING_VALUE,
    TrackedEvent,
    build_event,
    customer_of,
    event_id_of,
)
from outpost_core._filters import EventView

UUID = "9f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"
C1 = Customer("external", "c1")
T = 1_796_223_600_123_456
LLM = {
    "vendor": "openai",
    "model": "gpt-4o",
    "input_tokens": 10,
    "output_tokens": 20,
    "total_tokens": 30,
}


def event(metadata: object = None, **overrides: Any) -> TrackedEvent:
    arguments: dict[str, Any] = {
        "event_id": "e1",
        "name": "api_call",
        "customer": C1,
        "metadata": metadata,
        "timestamp_us": T,
    }
    arguments.update(overrides)
    return build_event(**arguments)


def test_limits() -> None:
    assert (MAX_NAME, MAX_STRING_VALUE, MAX_EVENT_ID) == (128, 500, 256)


def test_customer_of_external_id() -> None:
    assert customer_of("c1", None) == C1
    assert customer_of("a:b {c} ✓", None) == Customer("external", "a:b {c} ✓")


def test_customer_of_customer_id_is_lowercased() -> None:
    assert customer_of(None, UUID.upper()) == Customer("customer", UUID)
    assert customer_of(None, UUID) == Customer("customer", UUID)


@pytest.mark.parametrize(
    ("external", "customer", "message"),
    [
        (None, None, "exactly one"),
        ("c1", UUID, "exactly one"),
        ("", None, "external_customer_id must be a non-empty string"),
        (3, None, "external_customer_id must be a non-empty string"),
        (b"c1", None, "external_customer_id must be a non-empty string"),
        ("bad \ud800 surrogate", None, "not valid Unicode"),
        (None, "", "customer_id must be a non-empty string"),
        (None, 12, "customer_id must be a non-empty string"),
        (None, "not-a-uuid", "UUID"),
        (None, UUID[:-1], "UUID"),
        (None, UUID + "0", "UUID"),
        (None, "{" + UUID + "}", "UUID"),
        (None, "urn:uuid:" + UUID, "UUID"),
        (None, UUID.replace("9f", "zz"), "UUID"),
        (None, "\ud800" + UUID, "not valid Unicode"),
    ],
)
def test_customer_of_refuses(external: object, customer: object, message: str) -> None:
    with pytest.raises(InvalidEvent, match=message):
        customer_of(external, customer)


def test_customer_of_refuses_a_trailing_newline() -> None:
    with pytest.raises(InvalidEvent):
        customer_of(None, UUID + "\n")


def test_customer_of_canonicalises_the_uuid() -> None:
    assert customer_of(None, UUID.replace("-", "")) == customer_of(None, UUID)


def test_build_event_keeps_the_fields() -> None:
    tracked = event({"tokens": 3, "model": "m", "ok": True, "ratio": 0.5})
    assert tracked == TrackedEvent(
        event_id="e1",
        name="api_call",
        customer=C1,
        timestamp_us=T,
        metadata={"tokens": 3, "model": "m", "ok": True, "ratio": 0.5},
    )


def test_no_metadata_is_empty_metadata() -> None:
    assert event(None).metadata == {}
    assert event({}).metadata == {}


def test_view_is_what_filters_see() -> None:
    tracked = event({"tokens": 3})
    assert tracked.view() == EventView(
        name="api_call", timestamp_s=1_796_223_600, metadata={"tokens": 3}, subsecond_us=123_456
    )
    before_epoch = event(timestamp_us=-1).view()
    assert (before_epoch.timestamp_s, before_epoch.subsecond_us) == (-1, 999_999)  # floored


def test_ingest_item_shape() -> None:
    tracked = event({"tokens": 3, "_cost": {"amount": 12, "currency": "usd"}})
    assert tracked.ingest_item() == {
        "name": "api_call",
        "external_customer_id": "c1",
        "external_id": "e1",
        "timestamp": "2026-12-02T15:00:00.123456Z",
        "metadata": {"tokens": 3, "_cost": {"amount": 12, "currency": "usd"}},
    }
    by_id = build_event(
        event_id="e2",
        name="n",
        customer=Customer("customer", UUID),
        metadata=None,
        timestamp_us=0,
    )
    assert by_id.ingest_item() == {
        "name": "n",
        "customer_id": UUID,
        "external_id": "e2",
        "timestamp": "1970-01-01T00:00:00.000000Z",
        "metadata": {},
    }


def test_ingest_item_metadata_is_a_copy() -> None:
    tracked = event({"tokens": 3})
    item = tracked.ingest_item()
    item["metadata"]["tokens"] = 4
    assert tracked.metadata == {"tokens": 3}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": ""}, "name must be a non-empty string"),
        ({"name": None}, "name must be a non-empty string"),
        ({"name": 12}, "name must be a non-empty string"),
        ({"name": "x" * 129}, "at most 128 characters \\(129 given\\)"),
        ({"event_id": ""}, "event_id must be 1 to 256"),
        ({"event_id": "e" * 257}, "event_id must be 1 to 256"),
    ],
)
def test_build_event_refuses_names_and_ids(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidEvent, match=message):
        event(**overrides)


def test_name_and_event_id_at_their_limits() -> None:
    assert event(name="x" * 128, event_id="e" * 256).name == "x" * 128


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        0,
        -(2**63) + 1,
        2**63 - 1,
        0.0,
        -1.5,
        1e308,
        "x",
        "x" * 500,
        "✓" * 500,
    ],
)
def test_metadata_scalars_accepted(value: object) -> None:
    assert event({"k": value}).metadata == {"k": value}


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ("tokens=3", "metadata must be a mapping, got str"),
        ([("k", 1)], "metadata must be a mapping, got list"),
        ({1: 2}, "keys must be non-empty strings"),
        ({"": 2}, "keys must be non-empty strings"),
        ({"k": None}, "must be a string, an integer, a float or a boolean, got NoneType"),
        ({"k": [1]}, "got list"),
        ({"k": {"a": 1}}, "got dict"),
        ({"k": b"x"}, "got bytes"),
        ({"k": object()}, "got object"),
        ({"k": ""}, "must be 1 to 500 characters"),
        ({"k": "x" * 501}, "must be 1 to 500 characters"),
        ({"k": 2**63}, "out of the 64-bit range"),
        ({"k": -(2**63) - 1}, "out of the 64-bit range"),
        ({"k": math.nan}, "finite"),
        ({"k": math.inf}, "finite"),
        ({"k": -math.inf}, "finite"),
    ],
)
def test_metadata_refused(metadata: object, message: str) -> None:
    with pytest.raises(InvalidEvent, match=message):
        event(metadata)


def test_smallest_64_bit_integer_is_accepted() -> None:
    assert event({"k": -(2**63)}).metadata == {"k": -(2**63)}


def test_cost_accepted_and_normalised() -> None:
    assert event({"_cost": {"amount": 12, "currency": "usd"}}).metadata == {
        "_cost": {"amount": 12, "currency": "usd"}
    }
    assert event({"_cost": {"currency": "usd", "amount": -0.5}}).metadata["_cost"] == {
        "amount": -0.5,
        "currency": "usd",
    }


@pytest.mark.parametrize(
    ("cost", "message"),
    [
        (None, "'_cost'\\] must be an object"),
        (12, "'_cost'\\] must be an object"),
        ({"amount": 1}, "missing \\['currency'\\]"),
        ({"currency": "usd"}, "missing \\['amount'\\]"),
        ({"amount": 1, "currency": "usd", "x": 1}, "unknown fields \\['x'\\]"),
        ({"amount": 1, "currency": "eur"}, "currency must be 'usd'"),
        ({"amount": 1, "currency": "USD"}, "currency must be 'usd'"),
        ({"amount": "1", "currency": "usd"}, "amount must be a number"),
        ({"amount": True, "currency": "usd"}, "amount must be a number"),
        ({"amount": math.nan, "currency": "usd"}, "finite"),
        ({"amount": 2**64, "currency": "usd"}, "64-bit"),
    ],
)
def test_cost_refused(cost: object, message: str) -> None:
    with pytest.raises(InvalidEvent, match=message):
        event({"_cost": cost})


def test_llm_required_fields_only() -> None:
    assert event({"_llm": LLM}).metadata == {"_llm": LLM}


def test_llm_optional_fields() -> None:
    full = dict(LLM, prompt="hi", response="hello", cached_input_tokens=4)
    assert event({"_llm": full}).metadata == {"_llm": full}
    nulls = dict(LLM, prompt=None, response=None)
    assert event({"_llm": nulls}).metadata == {"_llm": nulls}


@pytest.mark.parametrize("missing", sorted(LLM))
def test_llm_missing_required_field(missing: str) -> None:
    llm = {k: v for k, v in LLM.items() if k != missing}
    with pytest.raises(InvalidEvent, match=f"missing \\['{missing}'\\]"):
        event({"_llm": llm})


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"extra": 1}, "unknown fields \\['extra'\\]"),
        ({"vendor": 1}, "_llm'\\].vendor must be a string"),
        ({"model": None}, "_llm'\\].model must be a string"),
        ({"prompt": 3}, "_llm'\\].prompt must be a string"),
        ({"response": ["x"]}, "_llm'\\].response must be a string"),
        ({"input_tokens": 1.5}, "input_tokens must be an integer"),
        ({"output_tokens": "2"}, "output_tokens must be a number"),
        ({"total_tokens": True}, "total_tokens must be a number"),
        ({"cached_input_tokens": 2.0}, "cached_input_tokens must be an integer"),
        ({"total_tokens": 2**63}, "64-bit"),
    ],
)
def test_llm_refused(patch: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidEvent, match=message):
        event({"_llm": dict(LLM, **patch)})


def test_llm_must_be_an_object() -> None:
    with pytest.raises(InvalidEvent, match="'_llm'\\] must be an object"):
        event({"_llm": "gpt"})


def test_invalid_event_is_a_value_error_and_an_outpost_error() -> None:
    from outpost_core import OutpostError

    assert issubclass(InvalidEvent, ValueError)
    assert issubclass(InvalidEvent, OutpostError)


def test_the_event_time_is_now_or_an_aware_datetime() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    from outpost_core import timestamp_us_of

    assert timestamp_us_of(None, 123) == 123
    aware = datetime(2026, 1, 1, tzinfo=UTC)
    assert timestamp_us_of(aware, 0) == 1_767_225_600_000_000
    east = datetime(2026, 1, 1, 2, tzinfo=timezone(timedelta(hours=2)))
    assert timestamp_us_of(east, 0) == 1_767_225_600_000_000
    for bad in (datetime(2026, 1, 1), 1_767_225_600, "2026-01-01"):
        with pytest.raises(InvalidEvent, match="timezone-aware datetime"):
            timestamp_us_of(bad, 0)


def test_the_event_id_is_the_callers_or_a_new_one() -> None:
    from outpost_core import event_id_of

    assert event_id_of(None, "new") == "new"
    assert event_id_of("mine", "new") == "mine"
    with pytest.raises(InvalidEvent, match="event_id must be a string"):
        event_id_of(42, "new")


@pytest.mark.parametrize(
    "metadata",
    [
        {"path": "a\ud800b"},
        {"pa\udfffth": "x"},
        {"_llm": {**LLM, "model": "gpt-\ud800"}},
        {"_llm": {**LLM, "prompt": "\udc00"}},
    ],
)
def test_text_that_utf8_cannot_carry_is_refused(metadata: dict[str, Any]) -> None:
    """A lone surrogate would fail later, when the event is written to Redis, as a driver
    error instead of InvalidEvent (found by the TypeScript differential test)."""
    with pytest.raises(InvalidEvent, match="not valid Unicode"):
        event(metadata)


# -- exactly what Polar refuses (conformance/events.json holds the same rules as a table) --------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": "a\x00b"}, "name holds a NUL"),
        ({"event_id": "e\x00"}, "event_id holds a NUL"),
        ({"metadata": {"k\x00": 1}}, "metadata key 'k\\x00' holds a NUL"),
        ({"metadata": {"k": "v\x00"}}, "metadata['k'] holds a NUL"),
        ({"metadata": {"_cost": {"amount": 1e-13, "currency": "usd"}}}, "at most 17 digits"),
        ({"metadata": {"_cost": {"amount": 1 / 3, "currency": "usd"}}}, "12 of them"),
        ({"metadata": {"_cost": {"amount": 10**17, "currency": "usd"}}}, "at most 17 digits"),
        ({"metadata": {"_cost": {"amount": 1e20, "currency": "usd"}}}, "at most 17 digits"),
    ],
)
def test_build_event_refuses_what_polar_refuses(overrides: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {
        "event_id": "e1",
        "name": "api_call",
        "customer": Customer("external", "c1"),
        "metadata": {},
        "timestamp_us": 0,
    }
    arguments.update(overrides)
    with pytest.raises(InvalidEvent, match=re.escape(message)):
        build_event(**arguments)


@pytest.mark.parametrize("amount", [150, 0.000000000001, 12345.123456789012, 10**16, -2.5])
def test_cost_amounts_polars_decimal_holds(amount: float) -> None:
    metadata = {"_cost": {"amount": amount, "currency": "usd"}}
    event = build_event(
        event_id="e1", name="n", customer=Customer("external", "c1"), metadata=metadata,
        timestamp_us=0,
    )  # fmt: skip
    assert event.metadata["_cost"]["amount"] == amount


def test_customer_ids_and_event_ids_are_bounded_and_checked() -> None:
    assert customer_of("c" * MAX_CUSTOMER_ID, None).id == "c" * MAX_CUSTOMER_ID
    with pytest.raises(InvalidEvent, match="at most 256 characters"):
        customer_of("c" * (MAX_CUSTOMER_ID + 1), None)
    with pytest.raises(InvalidEvent, match="NUL"):
        customer_of("c\x00", None)
    with pytest.raises(InvalidEvent, match="lone surrogate"):
        event(event_id=event_id_of("e\ud800", "new"))
