"""Validation of `POST /v1/events/ingest` bodies (Polar's `EventsIngest` schema).

All or nothing: every invalid event gets its errors, with `loc = ["body", "events", i, ...]`,
so a client can drop exactly those events and resend the rest. Differences from Polar's pydantic
union (which tags locs with the member class name and reports both members) are listed in
docs/emulator.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from outpost_emulator._customers import Customers
from outpost_emulator._errors import Errors, Loc
from outpost_emulator._fields import (
    check_decimal,
    check_int,
    check_metadata_value,
    check_nul,
    check_str,
    check_uuid4,
)
from outpost_emulator._model import Identity, JsonObject
from outpost_emulator._timeutil import parse_iso, to_us

_PAST = "Timestamp must be in the past."


@dataclass(frozen=True, slots=True)
class EventInput:
    name: str
    timestamp_us: int
    identity: Identity
    external_id: str | None
    metadata: JsonObject


def validate_ingest(
    body: Any, now_us: int, customers: Customers
) -> tuple[list[EventInput], Errors]:
    errors = Errors()
    if not isinstance(body, dict):
        errors.not_an_object(("body",), body)
        return [], errors
    if "events" not in body:
        errors.missing(("body", "events"), body)
        return [], errors
    raw_events = body["events"]
    if not isinstance(raw_events, list):
        errors.add(("body", "events"), "list_type", "Input should be a valid list", raw_events)
        return [], errors
    events: list[EventInput] = []
    for i, raw in enumerate(raw_events):
        event = _validate_event(raw, ("body", "events", i), now_us, customers, errors)
        if event is not None:
            events.append(event)
    return events, errors


def _validate_event(
    raw: Any, loc: Loc, now_us: int, customers: Customers, errors: Errors
) -> EventInput | None:
    if not isinstance(raw, dict):
        errors.not_an_object(loc, raw)
        return None
    count = len(errors)

    name = raw.get("name")
    if "name" not in raw:
        errors.missing((*loc, "name"), raw)
    elif check_str(name, (*loc, "name"), errors, min_length=1, max_length=128):
        check_nul(name, (*loc, "name"), errors)

    timestamp_us = _timestamp(raw, loc, now_us, errors)

    for field in ("external_id", "parent_id", "external_member_id"):
        value = raw.get(field)
        if value is not None and check_str(value, (*loc, field), errors):
            check_nul(value, (*loc, field), errors)

    if raw.get("organization_id") is not None:
        org = check_uuid4(raw["organization_id"], (*loc, "organization_id"), errors)
        if org is not None:
            errors.add(
                (*loc, "organization_id"),
                "organization_token",
                "Setting organization_id is disallowed when using an organization token.",
                raw["organization_id"],
            )

    identity = _identity(raw, loc, customers, errors)
    metadata = _metadata(raw.get("metadata", {}), (*loc, "metadata"), errors)

    if len(errors) > count or identity is None or metadata is None or timestamp_us is None:
        return None
    return EventInput(cast("str", name), timestamp_us, identity, raw.get("external_id"), metadata)


def _timestamp(raw: JsonObject, loc: Loc, now_us: int, errors: Errors) -> int | None:
    if "timestamp" not in raw:
        return now_us  # Polar's default_factory: now
    value = raw["timestamp"]
    at = (*loc, "timestamp")
    # Only ISO-8601 strings: pydantic would also take Unix seconds (see docs/emulator.md).
    if not isinstance(value, str):
        errors.add(at, "datetime_type", "Input should be a valid datetime", value)
        return None
    try:
        parsed = parse_iso(value)
    except ValueError:
        msg = "Input should be a valid datetime or date, invalid format"
        errors.add(at, "datetime_from_date_parsing", msg, value, {"error": "invalid format"})
        return None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        errors.add(at, "timezone_aware", "Input should have timezone info", value)
        return None
    t_us = to_us(parsed)
    if t_us > now_us:  # "not in the future", on the emulator's clock
        errors.add(at, "value_error", f"Value error, {_PAST}", value, {"error": _PAST})
        return None
    return t_us


def _identity(raw: JsonObject, loc: Loc, customers: Customers, errors: Errors) -> Identity | None:
    customer_id = raw.get("customer_id")
    external = raw.get("external_customer_id")
    if customer_id is not None and external is not None:
        errors.add(
            (*loc, "external_customer_id"),
            "customer_identity",
            "Set exactly one of customer_id or external_customer_id, not both.",
            raw,
        )
        return None
    if customer_id is None and external is None:
        errors.missing((*loc, "customer_id"), raw)
        errors.missing((*loc, "external_customer_id"), raw)
        return None
    if external is not None:
        if check_str(external, (*loc, "external_customer_id"), errors):
            check_nul(external, (*loc, "external_customer_id"), errors)
            return ("external_customer_id", external)
        return None
    normalized = check_uuid4(customer_id, (*loc, "customer_id"), errors)
    if normalized is None:
        return None
    member_id = raw.get("member_id")
    if member_id is not None and check_uuid4(member_id, (*loc, "member_id"), errors):
        # The emulator has no members, so every member_id is unknown.
        errors.add((*loc, "member_id"), "member_id", "Member not found.", member_id)
    if customers.get(normalized) is None:
        errors.add((*loc, "customer_id"), "customer_id", "Customer not found.", customer_id)
        return None
    return ("customer_id", normalized)


def _metadata(value: Any, loc: Loc, errors: Errors) -> JsonObject | None:
    if not isinstance(value, dict):
        errors.add(loc, "dict_type", "Input should be a valid dictionary", value)
        return None
    count = len(errors)
    result: JsonObject = {}
    for key, item in value.items():
        if key == "_cost":
            result[key] = _cost(item, (*loc, key), errors)
        elif key == "_llm":
            result[key] = _llm(item, (*loc, key), errors)
        elif check_metadata_value(item, (*loc, key), errors):
            result[key] = item
    if len(errors) == count:
        check_nul(value, loc, errors)
    return result if len(errors) == count else None


def _cost(value: Any, loc: Loc, errors: Errors) -> JsonObject | None:
    """`{amount: Decimal(max_digits=17, decimal_places=12), currency: str matching "usd"}`."""
    if not isinstance(value, dict):
        errors.add(loc, "dict_type", "Input should be a valid dictionary", value)
        return None
    count = len(errors)
    amount = value.get("amount")
    if "amount" not in value:
        errors.missing((*loc, "amount"), value)
    else:
        check_decimal(amount, (*loc, "amount"), errors, max_digits=17, decimal_places=12)
    currency = value.get("currency")
    if "currency" not in value:
        errors.missing((*loc, "currency"), value)
    elif check_str(currency, (*loc, "currency"), errors) and "usd" not in currency:
        # pydantic's `pattern="usd"` is an unanchored search, as in Polar.
        msg = "String should match pattern 'usd'"
        errors.add((*loc, "currency"), "string_pattern_mismatch", msg, currency, {"pattern": "usd"})
    if len(errors) > count:
        return None
    number = float(str(amount).strip()) if isinstance(amount, str) else amount
    return {"amount": number, "currency": currency}


_LLM_STR = ("vendor", "model")
_LLM_INT = ("input_tokens", "output_tokens", "total_tokens")


def _llm(value: Any, loc: Loc, errors: Errors) -> JsonObject | None:
    """`{vendor, model, prompt?, response?, input_tokens, cached_input_tokens?, output_tokens,
    total_tokens}`; unknown keys are dropped, as pydantic's TypedDict does."""
    if not isinstance(value, dict):
        errors.add(loc, "dict_type", "Input should be a valid dictionary", value)
        return None
    count = len(errors)
    result: JsonObject = {}
    for key in _LLM_STR:
        if key not in value:
            errors.missing((*loc, key), value)
        elif check_str(value[key], (*loc, key), errors):
            result[key] = value[key]
    for key in ("prompt", "response"):
        item = value.get(key)
        if item is None or check_str(item, (*loc, key), errors):
            result[key] = item
    for key in (*_LLM_INT, "cached_input_tokens"):
        if key not in value:
            if key != "cached_input_tokens":
                errors.missing((*loc, key), value)
            continue
        number = check_int(value[key], (*loc, key), errors)
        if number is not None:
            result[key] = number
    return result if len(errors) == count else None
