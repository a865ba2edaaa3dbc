"""The baseline of ``memory.process``: what a naive cache of the raw state hashes would hold. In a
module of its own so that tracemalloc can tell its allocations from everyone else's."""

from __future__ import annotations

from typing import Any

import redis


def load(client: redis.Redis, names: list[str]) -> dict[str, Any]:
    return {name: client.hgetall(name) for name in names}
