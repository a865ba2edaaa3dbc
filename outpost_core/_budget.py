"""The request budget for Polar's API that every instance of an organization shares.

Polar admits 500 requests a minute per organization (100 in the sandbox), whatever the token. A
delivery loop takes one request from a token bucket in Redis (``budget.lua``, on Redis's clock)
before each ingestion request. When the bucket is empty the script reserves the next request
for the caller and says when it comes: the loop waits that long, its batch filling meanwhile,
then posts. A busy fleet so sends fewer, larger batches instead of a storm of 429s, and loops
are served in the order they asked (no loop starves while others win every race).

The default, 300 a minute, leaves the merchant's other API calls room. The bucket holds at most
a fifteenth of a minute's requests (20 for 300): the worst minute is then a full bucket plus a
minute of refill, 320, still under Polar's 500.
"""

from __future__ import annotations

from typing import Any

import attrs

from . import _keys

MAX_WAIT = 60.0
"""Longest a loop waits before asking the budget again: a reply asking for more (a budget set
absurdly low by another instance) is not trusted further."""


@attrs.frozen(slots=True)
class TakeRequest:
    """Run ``budget`` (KEYS: the budget key; ARGV: per minute, capacity, "" for Redis's clock);
    report :class:`BudgetAnswered`."""

    key: str
    per_minute: float
    capacity: int


@attrs.frozen(slots=True)
class BudgetAnswered:
    reply: Any
    """The script's reply: the µs to wait before sending the request taken (0: now)."""


def capacity(per_minute: float) -> int:
    """The bucket's size: a fifteenth of a minute's requests, at least one."""
    return max(1, int(per_minute // 15))


def take(per_minute: float) -> TakeRequest:
    return TakeRequest(_keys.BUDGET_KEY, per_minute, capacity(per_minute))


def wait_of(outcome: BudgetAnswered) -> float | None:
    """Seconds to wait before sending the request taken (0.0: now); ``None`` for a reply that
    is not a count of microseconds (the caller counts it and goes ahead: posting without the
    budget is what an instance did before it had one, and Polar's 429 still holds it back)."""
    reply = outcome.reply
    if isinstance(reply, bytes):
        try:
            reply = int(reply)
        except ValueError:
            return None
    if not isinstance(reply, int) or isinstance(reply, bool) or reply < 0:
        return None
    return min(reply / 1e6, MAX_WAIT)
