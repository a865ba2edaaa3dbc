"""The HTTP proxy Polar's WebSocket goes through, chosen as httpx chooses one for ingestion.

httpx reads ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY`` and ``NO_PROXY`` (through
``urllib.request.getproxies``); the WebSocket reads the same, so both connections take the same
way out: ``wss://`` uses the proxy ``https://`` would, ``ws://`` the one ``http://`` would. The
tunnel is an HTTP ``CONNECT``, with Basic credentials when the proxy URL carries them; TLS to
Polar then runs inside it, verified as without a proxy. Only ``http://`` proxies are supported:
another scheme fails the connection with a reason that says so, it is never bypassed.
"""

from __future__ import annotations

import base64
import urllib.parse
import urllib.request

import attrs

from outpost_core import redact_url

MAX_REPLY = 16_384  # a proxy's answer to CONNECT is a few lines


class ProxyError(ConnectionError):
    """The proxy cannot be used, or refused the tunnel."""


@attrs.frozen
class Proxy:
    url: str
    host: str
    port: int
    authorization: str | None = attrs.field(default=None, repr=False)  # a credential

    def connect_request(self, host: str, port: int) -> bytes:
        lines = [f"CONNECT {host}:{port} HTTP/1.1", f"Host: {host}:{port}"]
        if self.authorization is not None:
            lines.append(f"Proxy-Authorization: {self.authorization}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def check_reply(self, head: bytes, host: str, port: int) -> None:
        """Raise :class:`ProxyError` unless ``head`` (the reply up to its blank line) opened
        the tunnel."""
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ProxyError(f"the proxy {self.url} answered CONNECT with {status_line!r}")
        if not 200 <= int(parts[1]) < 300:
            raise ProxyError(
                f"the proxy {self.url} refused the tunnel to {host}:{port}: {status_line}"
            )


def proxy_for(host: str, tls: bool) -> Proxy | None:
    """The proxy for ``wss://host`` (``tls``) or ``ws://host``, or ``None`` for a direct
    connection. Raises :class:`ProxyError` for a proxy URL it cannot use."""
    proxies = urllib.request.getproxies()
    url = proxies.get("https" if tls else "http") or proxies.get("all")
    if not url or _bypassed(host, proxies.get("no", "")):
        return None
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise ProxyError(
            f"the proxy {redact_url(url)} cannot carry the WebSocket: only http:// proxies are "
            "supported"
        )
    authorization = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        authorization = f"Basic {token}"
    shown = f"http://{parts.hostname}:{parts.port or 80}"  # never the credentials
    return Proxy(shown, parts.hostname, parts.port or 80, authorization)


def _bypassed(host: str, no_proxy: str) -> bool:
    """``NO_PROXY`` as httpx reads it: ``*``, an exact host, or a domain suffix."""
    host = host.lower().strip("[]")
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        entry = entry.split("://", 1)[-1].strip("[]")
        if host == entry or host.endswith(entry if entry.startswith(".") else f".{entry}"):
            return True
    return False
