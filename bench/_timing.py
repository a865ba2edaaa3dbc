"""Timed loops shared by the benchmarks: each call timed alone with ``perf_counter_ns`` after a
garbage collection, the callee called directly (a wrapper around it would be timed too). The
async loop mirrors the sync one line for line."""

from __future__ import annotations

import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any


def timed_calls(call: Callable[[Any], object], arg: Any, ops: int) -> list[int]:
    """``call(arg)`` ``ops`` times, each call's ns (``client.get`` and a key: GET round trips)."""
    pc = time.perf_counter_ns
    gc.collect()
    out = [0] * ops
    for i in range(ops):
        t0 = pc()
        call(arg)
        out[i] = pc() - t0
    return out


async def timed_calls_async(
    call: Callable[[Any], Awaitable[object]], arg: Any, ops: int
) -> list[int]:
    """``await call(arg)`` ``ops`` times, each call's ns."""
    pc = time.perf_counter_ns
    gc.collect()
    out = [0] * ops
    for i in range(ops):
        t0 = pc()
        await call(arg)
        out[i] = pc() - t0
    return out
