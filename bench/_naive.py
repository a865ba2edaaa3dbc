"""The baseline of ``memory.process``: what a naive cache of the raw state hashes would hold, a
dict of each identity's ``HGETALL`` reply, measured object by object with ``sys.getsizeof``
(exact for a dict of dicts of bytes, and free of the noise other threads add to tracemalloc)."""

from __future__ import annotations

import sys
from typing import Any

import redis


def load(client: redis.Redis, names: list[str]) -> dict[str, Any]:
    return {name: client.hgetall(name) for name in names}


def size(cache: dict[str, Any]) -> int:
    total = sys.getsizeof(cache)
    for name, reply in cache.items():
        total += sys.getsizeof(name) + sys.getsizeof(reply)
        for field, value in reply.items():
            total += sys.getsizeof(field) + sys.getsizeof(value)
    return total
