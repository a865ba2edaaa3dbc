"""How a test's instance is wired: to the emulator, to a test Redis, and quiet and quick."""

from __future__ import annotations

from typing import Any

from outpost_core import DEFAULT_SHARDS
from outpost_emulator import Emulator
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_server import RedisServer


def shards_of(server: RedisServer | RedisCluster) -> int:
    """The shard count of the deployment a test server stands for (a cluster's may not be 16)."""
    return int(getattr(server, "shards", DEFAULT_SHARDS))


def wired(server: RedisServer | RedisCluster, emulator: Emulator, **options: Any) -> dict[str, Any]:
    """An instance's keyword arguments: the emulator's token, URL and clock, the server's Redis
    and shard count, no telemetry, batches sent within 20 ms; ``options`` add or replace."""
    return {
        "access_token": emulator.token,
        "server_url": emulator.url,
        "redis_url": server.url,
        "clock": emulator.clock,
        "telemetry": False,
        "linger": 0.02,
        "shards": shards_of(server),
        **options,
    }
