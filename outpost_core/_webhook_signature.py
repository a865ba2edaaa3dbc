"""Standard Webhooks signatures, as Polar signs its webhooks: pure HMAC, no I/O.

A delivery carries ``webhook-id``, ``webhook-timestamp`` (Unix seconds) and
``webhook-signature``: space-separated ``v1,<base64>`` entries, each an HMAC-SHA256 of
``"{id}.{timestamp}.{body}"`` keyed by the base64 part of the endpoint's ``whsec_`` secret. A
delivery is genuine when one entry matches and the timestamp is within the tolerance of now
(which stops a captured delivery from being replayed later).

The secret is the caller's: a malformed one raises at once. The headers and body are the
peer's: whatever they hold gives a verdict, never an exception.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping

import attrs

from .errors import UsageError

TOLERANCE_S = 300
"""Standard Webhooks' default: a delivery stamped more than five minutes from now is refused."""


@attrs.frozen(slots=True)
class Verdict:
    genuine: bool
    reason: str = ""
    message_id: str = ""


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret (a bare base64 string is accepted too)."""
    encoded = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise UsageError("the webhook secret is not whsec_<base64>") from None
    if not key:
        raise UsageError("the webhook secret is empty")
    return key


def _header(headers: Mapping[str, str] | Mapping[bytes, bytes], name: str) -> str | None:
    for key, value in headers.items():
        text_key = key.decode("latin-1") if isinstance(key, bytes) else key
        if text_key.lower() == name:
            return value.decode("latin-1") if isinstance(value, bytes) else value
    return None


def sign(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,<base64>`` entry for these parts."""
    digest = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(digest.digest()).decode()


def verify(
    key: bytes,
    headers: Mapping[str, str] | Mapping[bytes, bytes],
    body: bytes,
    now_s: float,
    tolerance_s: float = TOLERANCE_S,
) -> Verdict:
    message_id = _header(headers, "webhook-id")
    stamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    if not message_id or stamp is None or signatures is None:
        return Verdict(False, "missing webhook-id, webhook-timestamp or webhook-signature")
    if not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
        return Verdict(False, "webhook-timestamp is not Unix seconds", message_id)
    timestamp = int(stamp)
    if abs(now_s - timestamp) > tolerance_s:
        return Verdict(False, "webhook-timestamp is too far from now", message_id)
    expected = sign(key, message_id, timestamp, body).encode()
    for entry in signatures.split(" "):
        if hmac.compare_digest(entry.encode(), expected):
            return Verdict(True, message_id=message_id)
    return Verdict(False, "no signature matches", message_id)
