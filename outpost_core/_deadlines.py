"""Deadlines by key in a heap: finding what is due costs what is due, not how many keys wait.

Each key has at most one deadline; setting it again replaces it. Replaced and cancelled entries
stay in the heap until they surface (then they are skipped), and the heap is rebuilt when such
leftovers outnumber the live deadlines, so it never holds more than about twice what waits.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Deadlines(Generic[K]):
    def __init__(self) -> None:
        self._due: dict[K, float] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._order = itertools.count()
        """Ties break by insertion: keys need not be comparable."""

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, key: object) -> bool:
        return key in self._due

    def get(self, key: K) -> float | None:
        return self._due.get(key)

    def set(self, key: K, when: float | None) -> None:
        """Give ``key`` the deadline ``when`` (``None``: none)."""
        if when is None:
            self._due.pop(key, None)
            return
        if self._due.get(key) == when:
            return
        self._due[key] = when
        heapq.heappush(self._heap, (when, next(self._order), key))
        if len(self._heap) > 2 * len(self._due) + 64:
            self._heap = [(w, next(self._order), k) for k, w in self._due.items()]
            heapq.heapify(self._heap)

    def cancel(self, key: K) -> None:
        self._due.pop(key, None)

    def pop_due(self, now: float) -> list[K]:
        """The keys whose deadline is ``now`` or earlier, earliest first; they no longer wait."""
        heap, due, out = self._heap, self._due, []
        while heap and heap[0][0] <= now:
            when, _, key = heapq.heappop(heap)
            if due.get(key) == when:
                del due[key]
                out.append(key)
        return out

    def next(self) -> float | None:
        """The earliest deadline, or ``None``."""
        heap, due = self._heap, self._due
        while heap and due.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None
