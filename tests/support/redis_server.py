"""The tests' single redis-server processes. The launcher ships in
``outpost_emulator.redis_server`` (``outpost demo`` starts one with it); replicas and clusters are
in ``redis_cluster``."""

from __future__ import annotations

from outpost_emulator.redis_server import REDIS_SERVER, RedisServer, free_port, running

__all__ = ["REDIS_SERVER", "RedisServer", "discard", "free_port", "running"]


def discard(server: RedisServer) -> None:
    """Close a server whose data no test reads again: killed rather than shut down. Its
    SIGTERM shutdown waits for its next cron tick (100 ms), a primary's also for its replicas,
    and every test that started one paid that at its teardown."""
    server.kill()
    server.close()
