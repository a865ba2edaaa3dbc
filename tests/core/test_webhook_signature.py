"""Standard Webhooks verification (pure HMAC): a forged, altered or replayed delivery is
refused with a reason; a malformed secret is the caller's error."""

from __future__ import annotations

import base64

import pytest

from outpost_core._webhook_signature import secret_key, sign, verify
from outpost_core.errors import UsageError

KEY = b"0123456789abcdef0123"
SECRET = "whsec_" + base64.b64encode(KEY).decode()
BODY = b'{"type":"customer.state_changed"}'
NOW = 1_796_223_720


def headers(body: bytes = BODY, at: int = NOW, key: bytes = KEY) -> dict[str, str]:
    return {
        "Webhook-Id": "msg_1",
        "webhook-timestamp": str(at),
        "webhook-signature": "v1,bogus " + sign(key, "msg_1", at, body),
    }


def test_secret_forms() -> None:
    assert secret_key(SECRET) == KEY
    assert secret_key(base64.b64encode(KEY).decode()) == KEY
    with pytest.raises(UsageError):
        secret_key("whsec_not base64!")
    with pytest.raises(UsageError):
        secret_key("whsec_")


def test_genuine() -> None:
    verdict = verify(KEY, headers(), BODY, NOW + 10)
    assert verdict.genuine and verdict.message_id == "msg_1"
    raw = {k.encode(): v.encode() for k, v in headers().items()}
    assert verify(KEY, raw, BODY, NOW).genuine


@pytest.mark.parametrize(
    ("hdrs", "body", "now", "reason"),
    [
        ({}, BODY, NOW, "missing"),
        ({**headers(), "webhook-timestamp": "soon"}, BODY, NOW, "Unix seconds"),
        ({**headers(), "webhook-timestamp": "9" * 30}, BODY, NOW, "Unix seconds"),
        (headers(), BODY, NOW + 301, "too far"),
        (headers(), BODY, NOW - 301, "too far"),
        (headers(), BODY + b" ", NOW, "no signature"),
        (headers(key=b"other"), BODY, NOW, "no signature"),
        ({**headers(), "webhook-signature": "v1,ü"}, BODY, NOW, "no signature"),
    ],
)
def test_refused(hdrs: dict[str, str], body: bytes, now: int, reason: str) -> None:
    verdict = verify(KEY, hdrs, body, now)
    assert not verdict.genuine and reason in verdict.reason
