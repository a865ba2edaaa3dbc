"""How a loop that talks to Redis reports an outage: once when it starts, then at most one
reminder a minute, and once when it ends; and how long it waits before trying again.

A loop that retries Redis without this logs a line per attempt (thousands a second when nothing
listens on the port). The driver calls :meth:`Outage.failed` after each failure and sleeps for
the delay it returns, and :meth:`Outage.succeeded` after each success; each returns the log line
to write, if any. Time and the jitter draw come in as data.
"""

from __future__ import annotations

import logging

import attrs

from ._backoff import backoff


@attrs.frozen(slots=True)
class Report:
    """One log line: ``level`` is a :mod:`logging` level."""

    level: int
    message: str


@attrs.define
class Outage:
    what: str
    """What the loop does, for the log lines ("the subscriber", "delivery 0")."""
    peer: str = "Redis"
    """Who does not answer ("Polar" for the WebSocket)."""
    base: float = 0.05
    cap: float = 5.0
    reminder: float = 60.0
    failures: int = 0
    """Consecutive failures of the current outage (0: Redis is answering)."""
    since: float = 0.0
    reminded_at: float = 0.0
    error: str | None = None
    """The last error of the outage in progress (``None`` while Redis answers)."""

    def failed(self, now: float, error: str, draw: float) -> tuple[float, Report | None]:
        """Redis failed: the seconds to wait before the next try, and what to log."""
        self.failures += 1
        self.error = error
        delay = backoff(self.failures, self.base, self.cap, draw)
        if self.failures == 1:
            self.since = self.reminded_at = now
            return delay, Report(
                logging.WARNING, f"outpost: {self.peer} unreachable for {self.what}: {error}"
            )
        if now - self.reminded_at >= self.reminder:
            self.reminded_at = now
            seconds = now - self.since
            text = f"outpost: {self.peer} still unreachable for {self.what} after {seconds:.0f} s"
            text += f": {error}"
            return delay, Report(logging.WARNING, text)
        return delay, None

    def succeeded(self, now: float) -> Report | None:
        """Redis answered: what to log when that ends an outage."""
        if not self.failures:
            return None
        seconds, self.failures, self.error = now - self.since, 0, None
        text = f"outpost: {self.peer} is back for {self.what} after {seconds:.1f} s"
        return Report(logging.INFO, text)

    @property
    def down(self) -> bool:
        return self.failures > 0
