"""Run callables concurrently: threads here, tasks in the async twin (hand-written, both)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor


def run_concurrently(workers: Sequence[Callable[[], None]]) -> None:
    with ThreadPoolExecutor(max_workers=len(workers)) as pool:
        for future in [pool.submit(worker) for worker in workers]:
            future.result()
