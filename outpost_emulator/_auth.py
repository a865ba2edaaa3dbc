"""Organization access tokens, their scopes, and Polar's 401/403 answers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from starlette.responses import JSONResponse

from outpost_emulator._defaults import DEFAULT_TOKEN
from outpost_emulator._errors import detail_response

DEFAULT_SCOPES = frozenset(
    {"events:read", "events:write", "meters:read", "meters:write", "customer_meters:read"}
)
_REALM = 'Bearer realm="polar"'


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

    def check(self, headers: Mapping[str, str], any_of: Iterable[str]) -> JSONResponse | None:
        """None when the request may go on, else the 401/403 response to send.

        Like Polar's Authenticator, one of `any_of` is enough.
        """
        header = headers.get("authorization")
        if header is None:
            # Polar: an anonymous subject on an authenticated route -> Unauthorized().
            return detail_response(
                401, "Unauthorized", error="Unauthorized", headers={"WWW-Authenticate": _REALM}
            )
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        scopes = self.scopes(token) if scheme.lower() == "bearer" and token else None
        if scopes is None:
            # Polar: authlib's InvalidTokenError -> {"error": "invalid_token", ...}.
            description = (
                "The access token provided is expired, revoked, malformed, "
                "or invalid for other reasons."
            )
            return detail_response(
                401,
                description,
                error="invalid_token",
                headers={"WWW-Authenticate": f'{_REALM}, error="invalid_token"'},
                extra={"error_description": description},
            )
        required = set(any_of)
        if scopes & required:
            return None
        description = "The request requires higher privileges than provided by the access token."
        needed = " ".join(sorted(required))
        return detail_response(
            403,
            description,
            error="insufficient_scope",
            headers={"WWW-Authenticate": f'{_REALM}, error="insufficient_scope", scope="{needed}"'},
            extra={"error_description": description},
        )
