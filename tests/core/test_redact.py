"""Secrets out of every output: URL passwords, password-like query parameters, known secrets
inside texts, and the warning for a token sent in clear."""

from __future__ import annotations

import pytest

from outpost_core import ConnectionOptions
from outpost_core._redact import cleartext_token_warning, redact_url, scrub, url_secrets


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://user:pw@h/1", "rediss://user:***@h/1"),
        ("redis://tok@h", "redis://***@h"),
        ("redis://h:6379/0?password=pw&ssl_cert_reqs=none", "redis://h:6379/0?password=***&ssl_cert_reqs=none"),
        ("socks5://bob:p%40ss@proxy:1080", "socks5://bob:***@proxy:1080"),
        ("https://api.polar.sh", "https://api.polar.sh"),
        ("redis://h?db=1", "redis://h?db=1"),
        ("http://u:pw@[::1", "http://u:***@[::1"),  # not a URL (unclosed bracket): masked anyway
    ],
)  # fmt: skip
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_url_secrets_and_scrub() -> None:
    assert set(url_secrets("redis://u:p%40ss@h/0?token=t1")) == {"p%40ss", "p@ss", "t1"}
    assert url_secrets("redis://tok@h") == ["tok"]
    assert url_secrets("http://[::1") == []
    text = "AUTH p@ss failed at redis://x:y@h with t1"
    assert scrub(text, ["p@ss", "t1", None, ""]) == "AUTH *** failed at redis://x:***@h with ***"
    assert scrub("see socks5://only@h", []) == "see socks5://***@h"


@pytest.mark.parametrize(
    ("url", "warned"),
    [
        ("http://polar.internal", True),
        ("http://10.0.0.5:8000", True),
        ("https://polar.internal", False),
        ("http://127.0.0.1:8000", False),
        ("http://[::1]:8000", False),
        ("http://localhost:8000", False),
        ("http://api.localhost", False),
        ("http://[::1", False),
    ],
)
def test_cleartext_token_warning(url: str, warned: bool) -> None:
    assert (cleartext_token_warning(url, "server URL") is not None) is warned


def test_connection_options_repr_and_warnings() -> None:
    options = ConnectionOptions.resolve(
        {}, access_token="tok-123", redis_url="redis://:pw@h/0",
        server_url="http://polar.internal", telemetry_url="http://relay.internal",
    )  # fmt: skip
    assert "tok-123" not in repr(options) and ":pw@" not in repr(options)
    assert "redis://:***@h/0" in repr(options)
    assert len(options.cleartext_warnings()) == 2
    assert (
        ConnectionOptions.resolve({}, server_url="http://polar.internal").cleartext_warnings() == []
    )
    same = ConnectionOptions.resolve({}, access_token="t", server_url="http://polar.internal")
    assert len(same.cleartext_warnings()) == 1  # the telemetry URL is the server URL: one warning
