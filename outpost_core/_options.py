"""Where each connection option comes from when the caller leaves it out: the environment, then a
default. The SDK and the operator CLI resolve them alike.

The core reads no environment: the driver hands over a copy (``os.environ``, as data) with the
arguments it was given. An empty variable counts as unset, as an empty argument does.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ._redact import cleartext_token_warning, redact_url

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_SERVER_URL = "https://api.polar.sh"
ACCESS_TOKEN_VARIABLE = "POLAR_ACCESS_TOKEN"
SERVER_URL_VARIABLE = "POLAR_SERVER_URL"
REDIS_URL_VARIABLE = "REDIS_URL"
TELEMETRY_VARIABLE = "POLAR_OUTPOST_TELEMETRY"
"""``0`` turns telemetry off, whatever the argument says; any other value leaves it to the
argument."""


@attrs.frozen(slots=True, kw_only=True)
class ConnectionOptions:
    access_token: str | None = attrs.field(repr=False)
    """``None``: no token anywhere, so no WebSocket, no delivery and no telemetry."""
    redis_url: str = attrs.field(repr=redact_url)
    server_url: str = attrs.field(repr=redact_url)
    telemetry: bool
    telemetry_url: str = attrs.field(repr=redact_url)
    """Where telemetry is relayed: Polar's API unless given."""

    @classmethod
    def resolve(
        cls,
        environ: Mapping[str, str],
        *,
        access_token: str | None = None,
        redis_url: str | None = None,
        server_url: str | None = None,
        telemetry: bool = True,
        telemetry_url: str | None = None,
    ) -> ConnectionOptions:
        """The argument where given, else the environment's variable, else the default."""
        server_url = server_url or environ.get(SERVER_URL_VARIABLE) or DEFAULT_SERVER_URL
        return cls(
            access_token=access_token or environ.get(ACCESS_TOKEN_VARIABLE) or None,
            redis_url=redis_url or environ.get(REDIS_URL_VARIABLE) or DEFAULT_REDIS_URL,
            server_url=server_url,
            telemetry=telemetry and environ.get(TELEMETRY_VARIABLE, "1") != "0",
            telemetry_url=telemetry_url or server_url,
        )

    def cleartext_warnings(self) -> list[str]:
        """What to warn about once: the token sent over plain ``http://`` to another machine."""
        if not self.access_token:
            return []
        found = [cleartext_token_warning(self.server_url, "server URL")]
        if self.telemetry and self.telemetry_url != self.server_url:
            found.append(cleartext_token_warning(self.telemetry_url, "telemetry URL"))
        return [w for w in found if w]


def cluster_node_url(url: str) -> str | None:
    """For ``redis+cluster://host:port`` (``rediss+cluster://`` with TLS), which names a Redis
    Cluster by any of its nodes, that node's plain URL; ``None`` for a URL of one Redis."""
    scheme, separator, rest = url.partition("://")
    if separator and scheme.endswith("+cluster"):
        return f"{scheme.removesuffix('+cluster')}://{rest}"
    return None
