"""Waiting on a condition with a deadline, for code that drives real processes."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Look at ``check`` every few milliseconds until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.005)


async def wait_until_async(
    check: Callable[[], Awaitable[bool] | bool], what: str, timeout: float = 15.0
) -> None:
    """:func:`wait_until` in an event loop: ``check`` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        outcome = check()
        if await outcome if inspect.isawaitable(outcome) else outcome:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        await asyncio.sleep(0.005)
