"""Validation of ``track()`` input, before anything is written.

Whatever Polar's ingestion API would refuse with a 422 is refused here with :class:`InvalidEvent`,
so an event that ``track()`` accepted is one Polar will store (its rules: docs/emulator.md,
"Ingestion").
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

import attrs

from ._filters import EventView
from ._keys import Customer
from ._time import iso, to_us
from .errors import InvalidEvent

MAX_NAME = 128
MAX_STRING_VALUE = 500
MAX_EVENT_ID = 256
MAX_CUSTOMER_ID = 256
"""Outpost's own bound on an external customer id (Polar sets none): every id is held in
memory and in Redis keys, so an end user cannot make one megabytes long."""
COST_MAX_DIGITS = 17
COST_DECIMAL_PLACES = 12
"""Polar stores ``_cost.amount`` as ``Decimal(max_digits=17, decimal_places=12)``."""
UUID_PATTERN = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.I)
_INT_RANGE = 2**63


@attrs.frozen(slots=True)
class TrackedEvent:
    event_id: str
    name: str
    customer: Customer
    timestamp_us: int
    metadata: Mapping[str, Any]

    def view(self) -> EventView:
        seconds, subsecond = divmod(self.timestamp_us, 1_000_000)
        return EventView(
            name=self.name, timestamp_s=seconds, metadata=self.metadata, subsecond_us=subsecond
        )

    def ingest_item(self) -> dict[str, Any]:
        """The event as an item of Polar's ``POST /v1/events/ingest`` body."""
        return {
            "name": self.name,
            **self.customer.wire(),
            "external_id": self.event_id,
            "timestamp": iso(self.timestamp_us),
            "metadata": dict(self.metadata),
        }


def customer_of(external_customer_id: object, customer_id: object) -> Customer:
    """The identity named by exactly one of the two keyword arguments."""
    if (external_customer_id is None) == (customer_id is None):
        raise InvalidEvent("pass exactly one of external_customer_id and customer_id")
    if external_customer_id is not None:
        text = _text(external_customer_id, "external_customer_id")
        if len(text) > MAX_CUSTOMER_ID:
            raise InvalidEvent(
                f"external_customer_id is at most {MAX_CUSTOMER_ID} characters ({len(text)} given)"
            )
        return Customer("external", text)
    text = _text(customer_id, "customer_id")
    if not UUID_PATTERN.fullmatch(text):
        raise InvalidEvent(f"customer_id must be a Polar customer UUID, got {text!r}")
    return Customer("customer", canonical_uuid(text))


def timestamp_us_of(timestamp: object, now_us: int) -> int:
    """When the event happened, in µs: ``now_us`` when the caller gave none, else its
    timezone-aware ``datetime`` (a naive one is ambiguous, so refused)."""
    if timestamp is None:
        return now_us
    if isinstance(timestamp, datetime) and timestamp.tzinfo is not None:
        return to_us(timestamp)
    raise InvalidEvent("timestamp must be a timezone-aware datetime")


def event_id_of(event_id: object, new_id: str) -> str:
    """The caller's event id, or ``new_id`` (a fresh one the driver drew) when it gave none."""
    if event_id is None:
        return new_id
    if not isinstance(event_id, str):
        raise InvalidEvent("event_id must be a string")
    return event_id


def canonical_uuid(text: str) -> str:
    """One spelling per customer: lower case, dashed 8-4-4-4-12."""
    h = text.replace("-", "").lower()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def build_event(
    *,
    event_id: str,
    name: object,
    customer: Customer,
    metadata: object,
    timestamp_us: int,
) -> TrackedEvent:
    if not isinstance(name, str) or not name:
        raise InvalidEvent(f"name must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME:
        raise InvalidEvent(f"name is at most {MAX_NAME} characters ({len(name)} given)")
    _encodable(name, "name")
    check_event_id(event_id)
    clean = _metadata(metadata)  # only JSON scalars and Polar's two objects: it serialises
    return TrackedEvent(
        event_id=event_id, name=name, customer=customer, timestamp_us=timestamp_us, metadata=clean
    )


def check_event_id(event_id: str) -> None:
    if not event_id or len(event_id) > MAX_EVENT_ID:
        raise InvalidEvent(f"event_id must be 1 to {MAX_EVENT_ID} characters")
    if not (type(event_id) is str and event_id.isascii()) or "\x00" in event_id:
        _encodable(event_id, "event_id")  # (ASCII text without a NUL passes it: UTF-8 carries it)


def _text(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidEvent(f"{field} must be a non-empty string, got {value!r}")
    return _encodable(value, field)


def _metadata(metadata: object) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidEvent(f"metadata must be a mapping, got {type(metadata).__name__}")
    clean: dict[str, Any] = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not key:
            raise InvalidEvent(f"metadata keys must be non-empty strings, got {key!r}")
        _encodable(key, f"metadata key {key!r}")
        if key == "_cost":
            clean[key] = _cost(value)
        elif key == "_llm":
            clean[key] = _llm(value)
        else:
            clean[key] = _scalar(value, f"metadata[{key!r}]")
    return clean


def _scalar(value: object, where: str) -> str | int | float | bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -_INT_RANGE <= value < _INT_RANGE:
            raise InvalidEvent(f"{where} is out of the 64-bit range")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidEvent(f"{where} must be a finite number, got {value!r}")
        return value
    if isinstance(value, str):
        if not 1 <= len(value) <= MAX_STRING_VALUE:
            raise InvalidEvent(f"{where} must be 1 to {MAX_STRING_VALUE} characters")
        return _encodable(value, where)
    raise InvalidEvent(
        f"{where} must be a string, an integer, a float or a boolean, got {type(value).__name__}"
    )


def _number(value: object, where: str, *, integer: bool = False) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidEvent(f"{where} must be a number")
    if integer and not isinstance(value, int):
        raise InvalidEvent(f"{where} must be an integer")
    return _scalar(value, where)  # type: ignore[return-value]


def _object(value: object, where: str, required: set[str], optional: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidEvent(f"{where} must be an object")
    missing = required - set(value)
    unknown = set(value) - required - optional
    if missing:
        raise InvalidEvent(f"{where} is missing {sorted(missing)}")
    if unknown:
        raise InvalidEvent(f"{where} has unknown fields {sorted(unknown)}")
    return value


def _cost(value: object) -> dict[str, Any]:
    obj = _object(value, "metadata['_cost']", {"amount", "currency"}, set())
    if obj["currency"] != "usd":
        raise InvalidEvent("metadata['_cost'].currency must be 'usd'")
    where = "metadata['_cost'].amount"
    amount = _number(obj["amount"], where)
    _decimal_fits(amount, where)
    return {"amount": amount, "currency": "usd"}


def _decimal_fits(value: int | float, where: str) -> None:
    """Refuse what Polar's decimal column cannot hold: more than 17 digits in all, more than 12
    after the point (a float is read as its shortest repr, as JSON writes it)."""
    _, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)  # finite: _number refused the rest
    decimals = max(0, -exponent)
    digits = len(digit_tuple) + exponent if exponent >= 0 else max(len(digit_tuple), decimals)
    if digits > COST_MAX_DIGITS or decimals > COST_DECIMAL_PLACES:
        raise InvalidEvent(
            f"{where} must have at most {COST_MAX_DIGITS} digits, {COST_DECIMAL_PLACES} of them "
            f"after the point (Polar's decimal), got {value!r}"
        )


_LLM_INTS = {"input_tokens", "output_tokens", "total_tokens"}


def _llm(value: object) -> dict[str, Any]:
    where = "metadata['_llm']"
    obj = _object(
        value,
        where,
        {"vendor", "model", *_LLM_INTS},
        {"prompt", "response", "cached_input_tokens"},
    )
    clean: dict[str, Any] = {}
    for field, item in obj.items():
        if field in ("vendor", "model"):
            clean[field] = _text_value(item, f"{where}.{field}")
        elif field in ("prompt", "response"):
            clean[field] = None if item is None else _text_value(item, f"{where}.{field}")
        else:
            clean[field] = _number(item, f"{where}.{field}", integer=True)
    return clean


def _text_value(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidEvent(f"{where} must be a string")
    return _encodable(value, where)


def _encodable(value: str, where: str) -> str:
    """``value``, if UTF-8 can carry it (a lone surrogate cannot: Redis would never see it) and
    Polar stores it (it refuses a NUL character anywhere, keys included)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidEvent(f"{where} is not valid Unicode text (a lone surrogate)") from None
    if "\x00" in value:
        raise InvalidEvent(f"{where} holds a NUL character, which Polar refuses")
    return value
