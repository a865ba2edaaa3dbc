"""The supervisor of an instance's background loops: none of them dies for good.

Every loop (the subscriber, the effects worker, the WebSocket's link loop, the delivery loops,
the telemetry worker) runs under :meth:`Supervisor.worker`. A loop that ends with an unexpected
exception is logged once with its traceback (then a reminder at most once a minute while it keeps
failing), named in ``status.failed_loop`` (its error without secrets), told to the session where
the copies can no longer be trusted (the loop's ``on_failure``: a dead subscriber is a lost
subscription, a dead link loop a failed connection), and started again after the core's backoff.
Cancellation and ``close()`` are not failures.
"""

from __future__ import annotations

import logging
import random
import re
import time
import traceback
from collections.abc import Awaitable, Callable

import attrs

from outpost_async._backend import Worker, sleep
from outpost_async._context import POLL, DriverContext
from outpost_core import backoff

_BASE = 0.1  # seconds before the first restart; doubled per failure in a row, up to _CAP
_CAP = 5.0
_REMINDER = 60.0  # seconds between two reminders of a loop that keeps failing
_SHOWN = 60.0  # seconds a failure stays in ``status`` after the loop last failed
_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]*@")  # user:password@ of a URL


@attrs.define
class LoopFailure:
    """A loop's failures in a row (one that ran ``_SHOWN`` seconds without failing starts over)."""

    error: str
    count: int
    since: float
    last: float
    reminded_at: float


class Supervisor:
    def __init__(self, context: DriverContext) -> None:
        self._context = context
        self._failures: dict[str, LoopFailure] = {}

    def worker(
        self,
        name: str,
        loop: Callable[[], Awaitable[None]],
        on_failure: Callable[[], Awaitable[None]] | None = None,
    ) -> Worker:
        """A worker running ``loop`` until the instance closes, restarting it when it fails;
        ``on_failure`` tells the session what the failure lost."""

        async def supervised() -> None:
            ctx = self._context
            while not ctx.closed:
                try:
                    await loop()
                    return  # a loop returns once the instance closes
                except Exception as exc:
                    if ctx.closed:
                        return
                    delay = self.failed(name, exc)
                if on_failure is not None:
                    try:
                        await on_failure()
                    except Exception:  # the restart is what matters: one line, no loop
                        ctx.log.exception("outpost: recovering from the failure of %s", name)
                restart_at = time.monotonic() + delay
                while not ctx.closed and (left := restart_at - time.monotonic()) > 0:
                    await sleep(min(left, POLL))  # looks at ``closed`` meanwhile

        return Worker(name, supervised)

    def failed(self, name: str, exc: Exception) -> float:
        """Count one failure of loop ``name``; log it; the seconds to wait before restarting."""
        ctx = self._context
        now = time.monotonic()
        error = redacted(f"{type(exc).__name__}: {exc}", ctx.access_token)
        with ctx.lock:
            failure = self._failures.get(name)
            if failure is None or now - failure.last >= _SHOWN:
                failure = self._failures[name] = LoopFailure(error, 0, now, now, now)
                first = True
            else:
                first = False
            failure.count += 1
            failure.error, failure.last = error, now
            remind = not first and now - failure.reminded_at >= _REMINDER
            if remind:
                failure.reminded_at = now
        if first:  # the traceback as text, redacted like the error (its messages may hold URLs)
            trace = redacted("".join(traceback.format_exception(exc)), ctx.access_token)
            ctx.log.error("outpost: the loop %s failed, restarting it: %s\n%s", name, error, trace)
        elif remind:
            ctx.log.log(
                logging.ERROR,
                "outpost: the loop %s still fails after %.0f s (%d failures): %s",
                name,
                now - failure.since,
                failure.count,
                error,
            )
        return backoff(failure.count, _BASE, _CAP, random.random())

    @property
    def failed_loop(self) -> str | None:
        """The loop that failed last within the last minute, and its error; or ``None``."""
        now = time.monotonic()
        with self._context.lock:
            recent = [f for f in self._failures.items() if now - f[1].last < _SHOWN]
        if not recent:
            return None
        name, failure = max(recent, key=lambda item: item[1].last)
        return f"{name}: {failure.error}"


def redacted(text: str, token: str | None) -> str:
    """``text`` without a URL's credentials or the access token."""
    text = _CREDENTIALS.sub("***@", text)
    if token:
        text = text.replace(token, "***")
    return text
