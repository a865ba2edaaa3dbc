"""Which customers a process follows, by recency of their last read; and a pace for bulk work.

A process keeps a copy, a cached balance and a snapshot flow per customer it follows. It follows
at most ``max_customers`` of them and lets go of the least recently read first, and of any not
read for ``idle_customer_ttl`` seconds. Reads come without a clock: a read moves its customer to
the recent end at once, and the next ``Tick`` stamps the customers read since the previous one
with its time, so keeping the order costs O(1) per read and the stamps cost what was read.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

from ._keys import Customer


class Following:
    def __init__(self) -> None:
        self._last: collections.OrderedDict[Customer, float] = collections.OrderedDict()
        """Customer → when last read (as of the tick after the read); least recent first."""
        self._touched: dict[Customer, None] = {}
        """Customers read since the last stamp."""
        self._reading: dict[Customer, float] = {}
        """Customers whose last read did not answer yet (a load, a snapshot or a fetch is on
        its way): not let go before this time."""
        self._waits: dict[Customer, float] = {}
        """The same for reads since the last stamp: for how long, from the stamp."""

    def __len__(self) -> int:
        return len(self._last)

    def __contains__(self, customer: object) -> bool:
        return customer in self._last

    def add(self, customer: Customer, now: float) -> None:
        """Start following ``customer`` (the most recent)."""
        self._last[customer] = now
        self._touched[customer] = None

    def touch(self, customer: Customer) -> None:
        """``customer`` is read now."""
        self._last.move_to_end(customer)
        self._touched[customer] = None

    def stamp(self, now: float) -> None:
        """Date the reads since the last stamp ``now``."""
        last = self._last
        for customer in self._touched:  # (letting a customer go drops it from both)
            last[customer] = now
        self._touched.clear()
        for customer, wait in self._waits.items():
            self._reading[customer] = now + wait
        self._waits.clear()

    def reading(self, customer: Customer, wait: float) -> None:
        """A read of ``customer`` waits for its answer, for up to ``wait`` seconds."""
        self._waits[customer] = wait

    def answered(self, customer: Customer) -> None:
        self._reading.pop(customer, None)
        self._waits.pop(customer, None)

    def pinned(self, customer: Customer, now: float) -> bool:
        """Whether a read of ``customer`` may still be waiting for its answer."""
        return customer in self._waits or self._reading.get(customer, now) > now

    def oldest(self) -> tuple[Customer, float] | None:
        for customer, last in self._last.items():
            return customer, last
        return None

    def drop(self, customer: Customer) -> None:
        del self._last[customer]
        self._touched.pop(customer, None)
        self.answered(customer)

    def recent(self, since: float) -> Iterator[Customer]:
        """The customers read at ``since`` or later (or since the last stamp), most recent
        first."""
        touched = self._touched
        for customer in reversed(self._last):
            if customer not in touched and self._last[customer] < since:
                return
            yield customer


class Pacer:
    """At most ``rate`` a second, in bursts of up to one second's worth (at least one)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._burst = max(rate, 1.0)
        self._tokens = self._burst
        self._at: float | None = None

    def take(self, now: float, wanted: int) -> int:
        """How many of ``wanted`` may go now (they are spent)."""
        if self._at is not None:
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        granted = min(wanted, int(self._tokens))
        self._tokens -= granted
        return granted

    def next_at(self, now: float) -> float:
        """When at least one more may go."""
        if self._at is None or self._tokens >= 1:
            return now
        return self._at + (1 - self._tokens) / self.rate
