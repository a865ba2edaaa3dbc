"""Polar's debounced jobs (`worker/_debounce.py`), on the emulator's clock.

Each enqueue keeps the oldest enqueue time of the key and delays the newest message by the
minimum; when a message runs, the newest one executes, and an older one executes only if the
oldest enqueue is older than the maximum by then. So a job runs `minimum` after the last
enqueue of a burst, and under continuous enqueues about every `maximum`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K")


@dataclass(slots=True)
class _Job:
    oldest_us: int
    due_us: int  # the newest message runs then
    forced_us: int | None = None  # the first older message that runs past the maximum


@dataclass(slots=True)
class Debouncer(Generic[K]):
    min_us: int
    max_us: int
    _jobs: dict[K, _Job] = field(default_factory=dict)

    def enqueue(self, key: K, now_us: int) -> None:
        run_at = now_us + self.min_us
        job = self._jobs.get(key)
        if job is None:
            self._jobs[key] = job = _Job(oldest_us=now_us, due_us=run_at)
        job.due_us = run_at
        if job.forced_us is None and run_at > job.oldest_us + self.max_us:
            job.forced_us = run_at

    def due(self, now_us: int) -> list[tuple[int, K]]:
        """The jobs due by `now_us`, as (instant, key) in time order; they leave the queue."""
        found = []
        for key, job in list(self._jobs.items()):
            at = job.due_us if job.forced_us is None else min(job.due_us, job.forced_us)
            if at <= now_us:
                found.append((at, key))
                del self._jobs[key]
        return sorted(found, key=lambda item: item[0])

    def __len__(self) -> int:
        return len(self._jobs)
