"""One real ``redis-server`` on a free loopback port, in a temporary directory: what ``outpost
demo`` starts when no Redis is given (the tests and the benchmarks start theirs with it too, and
kill and restart them). Replicas and clusters are test harness, in
``tests/support/redis_cluster.py``."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

REDIS_SERVER = shutil.which("redis-server")
START_TIMEOUT = 30.0  # seconds: a machine under load can be slow to start a redis-server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One redis-server. With ``durable=True`` it writes an fsync-always append-only file, so a
    killed and restarted server comes back with every acknowledged write."""

    def __init__(
        self, *, durable: bool = False, binary: str | None = None, port: int | None = None
    ) -> None:
        self.binary = binary or REDIS_SERVER
        if self.binary is None:
            raise RuntimeError("redis-server is not on PATH; see the README for how to get Redis")
        self.port = port or free_port()
        self._fixed_port = port is not None
        self.durable = durable
        self.directory = Path(tempfile.mkdtemp(prefix="outpost-redis-"))
        self._process: subprocess.Popen[bytes] | None = None
        self._clients: list[redis.Redis] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A plain client, closed with the server."""
        client = redis.Redis(port=self.port, socket_timeout=10)
        self._clients.append(client)
        return client

    def start(self) -> None:
        """Start it and wait until it answers. A port another process took between ``free_port``
        and the bind is given up for a new one (a fixed port is not); a loaded machine gets time."""
        for attempt in range(3):
            if self._start_once():
                return
            log = (self.directory / "redis.log").read_text(errors="replace")
            if self._fixed_port or "Address already in use" not in log or attempt == 2:
                raise RuntimeError(f"redis-server did not start: {log[-2000:]}")
            self.port = free_port()

    def _start_once(self) -> bool:
        """True once it answers; False if it exited; raises if it stays silent too long."""
        assert self.binary is not None
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--dir", str(self.directory),
            "--appendonly", "yes" if self.durable else "no",
            "--appendfsync", "always",
            "--loglevel", "warning",
            "--logfile", str(self.directory / "redis.log"),
            *self.extra_args(),
        ]  # fmt: skip
        self._process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + START_TIMEOUT
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            while True:
                with contextlib.suppress(redis.ConnectionError, redis.BusyLoadingError):
                    # PING answers once the data is loaded; INFO says whose answer it is: not
                    # another server's that took the port first (this one then exits).
                    if client.ping() and client.info("server")["process_id"] == self._process.pid:
                        return True
                if self._process.poll() is not None:
                    self._process = None
                    return False
                if time.monotonic() > deadline:
                    self.kill()
                    log = (self.directory / "redis.log").read_text(errors="replace")
                    raise RuntimeError(f"redis-server did not answer: {log[-2000:]}")
                time.sleep(0.01)
        finally:
            client.close()

    def extra_args(self) -> list[str]:
        """More redis-server arguments (a replica or a cluster node adds its own)."""
        return []

    def kill(self) -> None:
        """SIGKILL: no shutdown save, connections reset."""
        if self._process is not None:
            self._process.send_signal(signal.SIGKILL)
            self._process.wait(timeout=10)
            self._process = None

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def running(*, durable: bool = False) -> Iterator[RedisServer]:
    server = RedisServer(durable=durable)
    server.start()
    try:
        yield server
    finally:
        server.close()
