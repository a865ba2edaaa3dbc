"""A process that starts an instance, forks, and uses the inherited instance in the child (what
gunicorn --preload or uWSGI do to an app that used Outpost while loading).

    python -m tests.support.track_after_fork REDIS_URL SERVER_URL TOKEN METER COUNT

The child reads a customer's balance, then the parent tracks one event for that customer: the
child's copy must follow it (only a subscriber of the child's own can tell it). The child also
tracks COUNT events and flushes them. It prints ``child followed True flushed True``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from outpost_sync import Outpost

ROOT = Path(__file__).resolve().parents[2]


def run_forking(redis_url: str, server_url: str, token: str, meter: str, count: int) -> str:
    """Run this module in a child process until it exits; returns what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", __name__, redis_url, server_url, token, meter, str(count)],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    return done.stdout.decode()


def _consumed(outpost: Outpost, meter: str) -> float:
    return outpost.balance(meter, external_customer_id="shared").consumed


def _follows(outpost: Outpost, meter: str, consumed: float, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _consumed(outpost, meter) != consumed and time.monotonic() < deadline:
        time.sleep(0.01)
    return _consumed(outpost, meter) == consumed


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()  # before a fork, or the child would print the parent's buffer again


def main() -> None:
    redis_url, server_url, token, meter, count = sys.argv[1:6]
    outpost = Outpost(
        access_token=token, server_url=server_url, redis_url=redis_url, linger=0.02, telemetry=False
    )
    outpost.track("api_call", external_customer_id="parent")  # starts its threads
    _say("parent tracked 1")
    ready, go = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            before = _consumed(outpost, meter)
            os.write(go, b"r")  # the parent tracks for "shared" now
            followed = _follows(outpost, meter, before + 1, 10)
            for n in range(int(count)):
                outpost.track("api_call", external_customer_id=f"child-{n % 5}")
            flushed = outpost.flush(30)
            _say(f"child followed {followed} flushed {flushed}")
            outpost.close()
        finally:
            os._exit(0)
    os.read(ready, 1)
    outpost.track("api_call", external_customer_id="shared")
    _, status = os.waitpid(pid, 0)
    outpost.close()
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
