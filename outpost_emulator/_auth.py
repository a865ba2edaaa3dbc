"""Organization access tokens, their scopes, and Polar's 401/403 answers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from outpost_emulator._defaults import DEFAULT_TOKEN

DEFAULT_SCOPES = frozenset(
    {"events:read", "events:write", "meters:read", "meters:write", "customer_meters:read"}
)
_REALM = 'Bearer realm="polar"'


@dataclass(frozen=True)
class Denied:
    """Why a request may not go on: the status, JSON body and headers Polar answers with.

    A decision, not a response: HTTP endpoints and the WebSocket upgrade each turn it into
    their own answer (see `_errors.denied_response`).
    """

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def _denied(
    status: int, error: str, description: str, www_authenticate: str, *, described: bool = True
) -> Denied:
    body: dict[str, Any] = {"error": error, "detail": description}
    if described:
        body["error_description"] = description
    return Denied(status, body, {"WWW-Authenticate": www_authenticate})


class Tokens:
    """token -> scopes. One organization owns every token."""

    def __init__(self, token: str = DEFAULT_TOKEN, scopes: Iterable[str] = DEFAULT_SCOPES):
        self._scopes: dict[str, frozenset[str]] = {token: frozenset(scopes)}

    def add(self, token: str, scopes: Iterable[str]) -> None:
        self._scopes[token] = frozenset(scopes)

    def scopes(self, token: str) -> frozenset[str] | None:
        return self._scopes.get(token)

    def to_json(self) -> dict[str, list[str]]:
        # Tokens are local test values, so the state dump may show them.
        return {t: sorted(s) for t, s in self._scopes.items()}

    def check(self, headers: Mapping[str, str], any_of: Iterable[str]) -> Denied | None:
        """None when the request may go on, else the 401/403 decision.

        Like Polar's Authenticator, one of `any_of` is enough.
        """
        header = headers.get("authorization")
        if header is None:
            # Polar: an anonymous subject on an authenticated route -> Unauthorized().
            return _denied(401, "Unauthorized", "Unauthorized", _REALM, described=False)
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        scopes = self.scopes(token) if scheme.lower() == "bearer" and token else None
        if scopes is None:
            # Polar: authlib's InvalidTokenError -> {"error": "invalid_token", ...}.
            description = (
                "The access token provided is expired, revoked, malformed, "
                "or invalid for other reasons."
            )
            return _denied(401, "invalid_token", description, f'{_REALM}, error="invalid_token"')
        required = set(any_of)
        if scopes & required:
            return None
        description = "The request requires higher privileges than provided by the access token."
        needed = " ".join(sorted(required))
        return _denied(
            403,
            "insufficient_scope",
            description,
            f'{_REALM}, error="insufficient_scope", scope="{needed}"',
        )
