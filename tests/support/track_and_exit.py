"""A script that tracks events and ends without calling ``close()``: the instance closes itself
as the interpreter exits, delivering what it queued.

    python -m tests.support.track_and_exit REDIS_URL SERVER_URL TOKEN COUNT
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.track_and_hang import track_events

ROOT = Path(__file__).resolve().parents[2]


def track_then_exit(redis_url: str, server_url: str, token: str, count: int) -> str:
    """Run this module in a child process until it exits; returns what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", __name__, redis_url, server_url, token, str(count)],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    return done.stdout.decode()


def main() -> None:
    # An hour's linger: without the exit hook nothing would be posted before the process ends.
    track_events(*sys.argv[1:5])


if __name__ == "__main__":
    main()
