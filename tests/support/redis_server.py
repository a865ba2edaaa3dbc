"""The tests' single redis-server processes. The launcher ships in
``outpost_emulator.redis_server`` (``outpost demo`` starts one with it); replicas and clusters are
in ``redis_cluster``."""

from __future__ import annotations

from outpost_emulator.redis_server import REDIS_SERVER, RedisServer, free_port, running

__all__ = ["REDIS_SERVER", "RedisServer", "free_port", "running"]
