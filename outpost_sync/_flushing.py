# GENERATED from outpost_async/_flushing.py by scripts/unasync.py: do not edit.
"""``flush()``: wait until every event queued now has left the outboxes (delivered, or dropped
and reported), as the core's ``FlushWatch`` decides when to look and how long to wait.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TypeVar

from outpost_core import FlushWatch, RedisUnavailable, last_entries
from outpost_sync._backend import sleep
from outpost_sync._context import POLL, DriverContext, redis_unavailable
from outpost_sync._outbox import per_stream, raising

_T = TypeVar("_T")
_READS = 3  # attempts of a flush's outbox read before it raises RedisUnavailable


def flush_outboxes(ctx: DriverContext, timeout: float, holding_nothing: Callable[[], bool]) -> bool:
    """Wait until every event queued now is delivered or dropped (``True``), at most
    ``timeout`` seconds (``False``). ``holding_nothing()``: whether no delivery loop of this
    instance holds entries it read."""
    marks = _read_outboxes(functools.partial(_outbox_marks, ctx))
    watch = FlushWatch(marks, time.monotonic(), timeout)
    ctx.flushing += 1
    ctx.deliveries.fire()
    try:
        while True:
            version = ctx.deliveries.version
            settling, idle = ctx.settling > 0, holding_nothing()
            if watch.look_now(time.monotonic(), settling=settling, holding_nothing=idle):
                left = _read_outboxes(functools.partial(_outbox_left, ctx, watch))
                if watch.looked(left):
                    return True
            wait = watch.wait(time.monotonic())
            if wait is None:
                return False
            ctx.deliveries.wait(version, wait)  # a settle of this instance wakes it
    finally:
        ctx.flushing -= 1


def _read_outboxes(read: Callable[[], _T]) -> _T:
    """``read()``, tried again a few times on a Redis failure: after Redis came back, a
    connection the pool kept from before fails once (on some redis-py releases its own retry
    does not recover it); past that, ``RedisUnavailable``."""
    for _ in range(_READS - 1):
        try:
            with redis_unavailable("reading the outboxes"):
                return read()
        except RedisUnavailable:
            sleep(POLL)
    with redis_unavailable("reading the outboxes"):
        return read()


def _outbox_marks(ctx: DriverContext) -> dict[str, object]:
    """The last entry of each outbox now: what a flush waits to see delivered."""
    streams = ctx.outboxes
    replies = per_stream(ctx, streams, lambda client, stream: client.xrevrange(stream, count=1))
    return last_entries(streams, raising(replies))


def _outbox_left(ctx: DriverContext, watch: FlushWatch) -> dict[str, bool]:
    """Per stream the flush still waits for, whether an entry up to its mark is left."""
    marks = watch.marks
    streams = list(marks)
    replies = per_stream(
        ctx, streams, lambda client, stream: client.xrange(stream, max=marks[stream], count=1)
    )
    return {stream: bool(left) for stream, left in zip(streams, raising(replies), strict=True)}
