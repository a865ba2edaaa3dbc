"""The tests' redis-server processes: the launcher lives in ``outpost_emulator.redis_server``
(shared with the benchmarks and the demo); this module keeps the tests' import path."""

from __future__ import annotations

from outpost_emulator.redis_server import (
    REDIS_SERVER,
    RedisCluster,
    RedisReplica,
    RedisServer,
    cluster_running,
    free_port,
    running,
)

__all__ = [
    "REDIS_SERVER",
    "RedisCluster",
    "RedisReplica",
    "RedisServer",
    "cluster_running",
    "free_port",
    "running",
]
