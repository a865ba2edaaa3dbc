# GENERATED from outpost_async/_ingest.py by scripts/unasync.py: do not edit.
"""Polar's ingestion API: the client delivery posts with, and one batch's request and answer."""

from __future__ import annotations

import httpx

from outpost_core import (
    BatchAnswered,
    BatchFailed,
    PostBatch,
    __version__,
    retry_after,
)
from outpost_io.tls import describe
from outpost_sync._context import DriverContext

_USER_AGENT = f"outpost-python/{__version__}"
MAX_ANSWER = 1 << 20
"""The most of an ingestion answer read (its error detail): 1 MiB."""


def open_ingestion(ctx: DriverContext) -> httpx.Client:
    """The ingestion API's client, with the instance's token, server, TLS and proxy settings."""
    return httpx.Client(
        base_url=ctx.server_url,
        headers={"Authorization": f"Bearer {ctx.access_token}", "User-Agent": _USER_AGENT},
        timeout=httpx.Timeout(30.0, connect=5.0),
        verify=ctx.tls,
    )


def post_batch(ctx: DriverContext, action: PostBatch) -> BatchAnswered | BatchFailed:
    """POST one batch; Polar's answer (its body read up to ``MAX_ANSWER``), or why none came
    and whether Polar may have received it."""
    http = ctx.http
    assert http is not None
    try:
        with http.stream(
            "POST",
            "/v1/events/ingest",
            content=action.body,
            headers={"Content-Type": "application/json"},
        ) as response:
            body = b""  # at most MAX_ANSWER: a peer's body of any size costs no more
            for chunk in response.iter_bytes():
                body += chunk[: MAX_ANSWER - len(body)]
                if len(body) >= MAX_ANSWER:
                    break
    except httpx.ProxyError as exc:  # the proxy refused the tunnel: nothing reached Polar
        reason = f"the proxy refused the tunnel to Polar: {exc}"
        return BatchFailed(reason, maybe_sent=False, stalls=True)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        untrusted = describe(exc, http.base_url.host)
        if untrusted is not None:  # no retry fixes it: delivery stalls and says why
            return BatchFailed(untrusted, maybe_sent=False, stalls=True)
        return BatchFailed(f"could not connect to Polar: {exc!r}", maybe_sent=False)
    except httpx.HTTPError as exc:
        return BatchFailed(f"ingestion request failed: {exc!r}", maybe_sent=True)
    wait = retry_after(response.headers.get("Retry-After"), ctx.now_us())
    return BatchAnswered(response.status_code, body, wait)
