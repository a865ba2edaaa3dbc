"""`Tokens.check` decides; the endpoints answer. The bodies are pinned byte for byte."""

from __future__ import annotations

import httpx
import pytest

from outpost_emulator import Emulator
from outpost_emulator._auth import Denied, Tokens
from tests.emulator.helpers import event

_REALM = 'Bearer realm="polar"'
_INVALID = "The access token provided is expired, revoked, malformed, or invalid for other reasons."
_SCOPE = "The request requires higher privileges than provided by the access token."


def test_a_granted_token_gets_no_decision() -> None:
    tokens = Tokens("t", ["events:write"])
    assert tokens.check({"authorization": "Bearer t"}, {"events:write", "meters:write"}) is None


def test_a_refusal_is_a_decision_not_a_response() -> None:
    denied = Tokens("t", ["events:read"]).check({"authorization": "Bearer t"}, {"events:write"})
    assert denied == Denied(
        403,
        {"error": "insufficient_scope", "detail": _SCOPE, "error_description": _SCOPE},
        {"WWW-Authenticate": f'{_REALM}, error="insufficient_scope", scope="events:write"'},
    )


@pytest.mark.parametrize(
    ("headers", "status", "body", "challenge"),
    [
        ({}, 401, b'{"error":"Unauthorized","detail":"Unauthorized"}', _REALM),
        (
            {"Authorization": "Bearer nope"},
            401,
            b'{"error":"invalid_token","detail":"%s","error_description":"%s"}'
            % (_INVALID.encode(), _INVALID.encode()),
            f'{_REALM}, error="invalid_token"',
        ),
        (
            {"Authorization": "Bearer polar_oat_readonly"},
            403,
            b'{"error":"insufficient_scope","detail":"%s","error_description":"%s"}'
            % (_SCOPE.encode(), _SCOPE.encode()),
            f'{_REALM}, error="insufficient_scope", scope="events:write"',
        ),
    ],
)
def test_refusal_bodies_are_byte_for_byte_polars(
    emu: Emulator, headers: dict[str, str], status: int, body: bytes, challenge: str
) -> None:
    emu.add_token("polar_oat_readonly", ["events:read"])
    response = httpx.post(
        f"{emu.url}/v1/events/ingest", json={"events": [event()]}, headers=headers, verify=False
    )
    assert (response.status_code, response.content) == (status, body)
    assert response.headers["WWW-Authenticate"] == challenge
