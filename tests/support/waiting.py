"""Waiting on a condition with a deadline, for code that drives real processes."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Look at ``check`` every few milliseconds until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.005)
