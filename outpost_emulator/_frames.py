"""Parsing client frames of the Outpost WebSocket (docs/protocol.md §1)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from outpost_emulator._customers import normalize_uuid
from outpost_emulator._model import Identity, JsonObject

MAX_FRAME_BYTES = 1024 * 1024
MAX_IDS = 10_000


@dataclass(frozen=True, slots=True)
class Frame:
    type: str
    payload: JsonObject
    request_id: str | None


class FrameError(Exception):
    def __init__(self, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_frame(message: Mapping[str, Any]) -> Frame:
    """An ASGI `websocket.receive` message -> Frame, or FrameError."""
    if message.get("bytes") is not None:
        raise FrameError("invalid_frame", "binary frames are not accepted; send JSON text")
    text = message.get("text")
    if not isinstance(text, str):
        raise FrameError("invalid_frame", "empty frame")
    if len(text.encode()) > MAX_FRAME_BYTES:
        raise FrameError("invalid_frame", f"frame larger than {MAX_FRAME_BYTES} bytes")
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise FrameError("invalid_frame", f"frame is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise FrameError("invalid_frame", "a frame is a JSON object {type, payload}")
    payload = data.get("payload")
    if payload is None:
        payload = {}
    request_id = payload.get("request_id") if isinstance(payload, dict) else None
    request_id = request_id if isinstance(request_id, str) else None
    kind = data.get("type")
    if not isinstance(kind, str):
        raise FrameError("invalid_frame", "a frame needs a string `type`", request_id)
    if not isinstance(payload, dict):
        raise FrameError("invalid_payload", "`payload` must be a JSON object", request_id)
    return Frame(kind, payload, request_id)


def require_request_id(frame: Frame) -> str:
    if frame.request_id is None:
        raise FrameError("invalid_payload", "`request_id` must be a string")
    return frame.request_id


def identity_of(frame: Frame) -> tuple[Identity, str]:
    """(normalized identity, the value as the client wrote it)."""
    payload = frame.payload
    external = payload.get("external_customer_id")
    customer_id = payload.get("customer_id")
    if (external is None) == (customer_id is None):
        raise FrameError(
            "invalid_payload",
            "give exactly one of `external_customer_id` or `customer_id`",
            frame.request_id,
        )
    if external is not None:
        if not isinstance(external, str):
            raise FrameError(
                "invalid_payload", "`external_customer_id` must be a string", frame.request_id
            )
        return ("external_customer_id", external), external
    normalized = normalize_uuid(customer_id) if isinstance(customer_id, str) else None
    if normalized is None or not isinstance(customer_id, str):
        raise FrameError("invalid_payload", "`customer_id` must be a UUID string", frame.request_id)
    return ("customer_id", normalized), customer_id


def counted_request(frame: Frame) -> tuple[str, str, list[str]]:
    """(request_id, snapshot_id, event_ids) of a `counted` frame."""
    request_id = require_request_id(frame)
    snapshot_id = frame.payload.get("snapshot_id")
    if not isinstance(snapshot_id, str):
        raise FrameError("invalid_payload", "`snapshot_id` must be a string", request_id)
    event_ids = frame.payload.get("event_ids")
    if not isinstance(event_ids, list):
        raise FrameError("invalid_payload", "`event_ids` must be a list of strings", request_id)
    if len(event_ids) > MAX_IDS:
        raise FrameError("too_many_ids", f"at most {MAX_IDS} ids per message", request_id)
    if not all(isinstance(e, str) for e in event_ids):
        raise FrameError("invalid_payload", "`event_ids` must be a list of strings", request_id)
    return request_id, snapshot_id, event_ids
