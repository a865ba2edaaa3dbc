"""Secrets out of every output: a URL's password, and any known secret inside a text.

A Redis URL (``redis://:password@host``, ``?password=`` in its query), a proxy URL
(``http://user:password@proxy``) and an access token must never reach a log line, an exception,
a repr or a command's output. Printing goes through these functions.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Iterable

MASK = "***"
_SECRET_PARAMS = frozenset({"password", "pass", "pwd", "token", "access_token", "secret"})
_USERINFO = re.compile(r"(?<=//)[^/@\s]*@")


def redact_url(url: str) -> str:
    """``url`` with its password (and any password-like query parameter) replaced by ``***``;
    the user name, host, port, path and the rest are kept."""
    try:
        parts = urllib.parse.urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostport = netloc.rpartition("@")
            user, colon, _ = userinfo.partition(":")
            # a bare userinfo may be a token (redis://token@host): all of it goes
            netloc = f"{user}:{MASK}@{hostport}" if colon else f"{MASK}@{hostport}"
        query = parts.query
        if query:
            pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
            if any(k.lower() in _SECRET_PARAMS for k, _ in pairs):
                query = urllib.parse.urlencode(
                    [(k, MASK if k.lower() in _SECRET_PARAMS else v) for k, v in pairs], safe="*"
                )
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:  # not even a URL (a bad port, a bracket): drop any user info it may hold
        return _USERINFO.sub(_mask_userinfo, url)


def url_secrets(url: str) -> list[str]:
    """The secrets a URL carries (its password, its password-like query values), to scrub from
    texts that may quote them (an exception a client library raised)."""
    try:
        parts = urllib.parse.urlsplit(url)
        found = [parts.password or "", parts.username or "" if parts.password is None else ""]
        pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        found += [v for k, v in pairs if k.lower() in _SECRET_PARAMS]
    except ValueError:
        return []
    return [s for s in {*found, *map(urllib.parse.unquote, found)} if s]


def scrub(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with each of ``secrets`` (and every URL's password in it) replaced by ``***``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _USERINFO.sub(_mask_userinfo, text)


def _mask_userinfo(match: re.Match[str]) -> str:
    user, colon, _ = match.group(0)[:-1].partition(":")
    return f"{user}:{MASK}@" if colon else f"{MASK}@"


def cleartext_token_warning(url: str, what: str) -> str | None:
    """Why sending a bearer token to ``url`` is unsafe (``http://`` to a host that is not this
    machine: anyone on the way reads the token), or ``None``."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return None
    if parts.scheme != "http" or _loopback(host):
        return None
    return (
        f"outpost sends the access token to the {what} {redact_url(url)} over plain http://: "
        "anyone on the network path can read it; use https://"
    )


def _loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
