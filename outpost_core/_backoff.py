"""One backoff for every retry the core or a driver schedules.

Exponential from ``base`` seconds, doubling per attempt up to ``cap``, with "equal jitter": the
delay is drawn uniformly from the upper half of the ceiling, so instances that failed together
spread out without ever retrying at once. The draw comes in as data (``draw`` in [0, 1)).
"""

from __future__ import annotations

from .errors import UsageError


def backoff(attempt: int, base: float, cap: float, draw: float) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first retry)."""
    if attempt < 1:
        raise UsageError(f"backoff attempts count from 1, got {attempt}")
    # The exponent stops growing long before a float overflows (2.0 ** 1024 raises): an outage
    # that fails a thousand times must still get the cap, not an OverflowError in its loop.
    ceiling: float = min(cap, base * 2.0 ** min(attempt - 1, 64))
    return ceiling * (0.5 + 0.5 * draw)
