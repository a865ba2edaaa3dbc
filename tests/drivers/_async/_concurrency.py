"""Run callables concurrently: tasks here, threads in the generated sync twin."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence


async def run_concurrently(workers: Sequence[Callable[[], Awaitable[None]]]) -> None:
    await asyncio.gather(*(worker() for worker in workers))
