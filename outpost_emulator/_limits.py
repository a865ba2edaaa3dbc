"""Polar's limits on its API: requests per minute per organization, and the ingestion body size.

Polar allows 500 requests a minute per organization in production (100 in the sandbox), shared by
all its tokens, and answers 429 with Retry-After beyond; an ingestion body above 10 MiB gets 413.
The window here is a sliding minute of wall-clock time (not the emulator's clock, which tests
move), counting every request the limit admitted.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable

DEFAULT_REQUESTS_PER_MINUTE = 500
MAX_BODY_BYTES = 10 * 1024 * 1024
WINDOW_S = 60.0


class RateLimit:
    def __init__(
        self,
        per_minute: int = DEFAULT_REQUESTS_PER_MINUTE,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if per_minute < 0:
            raise ValueError("the rate limit must be >= 0 requests a minute (0: no limit)")
        self.per_minute = per_minute
        self._clock = clock or time.monotonic
        self._admitted: collections.deque[float] = collections.deque()

    def admit(self) -> int | None:
        """``None`` when the request may go on (it is counted), else the Retry-After seconds."""
        if self.per_minute == 0:
            return None
        now = self._clock()
        while self._admitted and self._admitted[0] <= now - WINDOW_S:
            self._admitted.popleft()
        if len(self._admitted) < self.per_minute:
            self._admitted.append(now)
            return None
        return max(1, math.ceil(self._admitted[0] + WINDOW_S - now))

    def to_json(self) -> dict[str, int]:
        return {"requests_per_minute": self.per_minute, "in_window": len(self._admitted)}
