"""Fresh event ids for ``track()``: random UUIDs (version 4), in hex.

``uuid.uuid4()`` reads the system's randomness once per id and builds a ``UUID`` object: a few µs
a call, a visible share of a ``track()`` when many run at once. The ids here come from one read of
``os.urandom`` per 256 of them, the version and variant bits set as ``uuid4`` sets them.

A forked child forgets the ids its parent drew but had not used yet: it would otherwise hand out
the same ones, and a second event with an id already in its bucket is taken for a retry of the
first (not written). Threads may refill the pool at the same moment; each refill is a read of
its own, so no id is drawn twice.
"""

from __future__ import annotations

import os

_BATCH = 256
_VERSION_MASK = ~((0xF << 76) | (0x3 << 62))
_VERSION_4 = (0x4 << 76) | (0x2 << 62)  # version 4, RFC 4122 variant

_pool: list[str] = []


def new_event_id() -> str:
    """A random UUID4 as 32 hex digits, as ``uuid.uuid4().hex`` gives."""
    try:
        return _pool.pop()
    except IndexError:
        _refill()
        return new_event_id()


def _refill() -> None:
    global _pool
    raw = os.urandom(16 * _BATCH)
    _pool = [
        f"{int.from_bytes(raw[i : i + 16], 'big') & _VERSION_MASK | _VERSION_4:032x}"
        for i in range(0, len(raw), 16)
    ]


def _forget() -> None:
    global _pool
    _pool = []


os.register_at_fork(after_in_child=_forget)
