"""A process that tracks events, says so, then hangs before delivering any: the test kills it
with SIGKILL. Its batches are read (claimed) but never posted: linger is far longer than the test.
It says so only once its delivery loop has read every event, so all of them are held by it when it
dies (on a loaded machine the loop may otherwise not have read the last ones yet).

    python -m tests.support.track_and_hang REDIS_URL SERVER_URL TOKEN COUNT
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

from outpost_core import GROUP, keys
from outpost_sync import Outpost

ROOT = Path(__file__).resolve().parents[2]


def track_then_get_killed(
    redis_url: str, server_url: str, token: str, count: int, shards: int = keys.DEFAULT_SHARDS
) -> int:
    """Run this module in a child process (an instance of a deployment of ``shards``), wait until
    it tracked ``count`` events, SIGKILL it. Returns how many events it said it tracked."""
    child = subprocess.Popen(
        [sys.executable, "-m", __name__, redis_url, server_url, token, str(count), str(shards)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().decode().split()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()
    return int(line[1]) if len(line) == 2 and line[0] == "tracked" else 0


def track_events(
    redis_url: str, server_url: str, token: str, count: str, shards: str = "16"
) -> Outpost:
    """An instance that posts nothing on its own for an hour (linger), having tracked ``count``
    events; says so on stdout."""
    outpost = Outpost(
        shards=int(shards),
        access_token=token,
        server_url=server_url,
        redis_url=redis_url,
        linger=3600,
        batch_size=100_000,
        telemetry=False,
    )
    for n in range(int(count)):
        outpost.track("api_call", external_customer_id=f"c{n % 7}")
    _wait_until_read(outpost, int(count))
    sys.stdout.write(f"tracked {count}\n")
    sys.stdout.flush()
    return outpost


def _wait_until_read(outpost: Outpost, count: int) -> None:
    """Until the outbox group holds ``count`` entries read and not settled (or 30 s)."""
    client = outpost._context.redis  # one Redis or a cluster, as the URL said
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            held = sum(client.xpending(s, GROUP)["pending"] for s in outpost._context.outboxes)
        except redis.ResponseError:  # NOGROUP: the delivery loop has not created it yet
            held = 0
        if held >= count:
            break
        time.sleep(0.01)


def main() -> None:
    track_events(*sys.argv[1:6])
    threading.Event().wait()


if __name__ == "__main__":
    main()
