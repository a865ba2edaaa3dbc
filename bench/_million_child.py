"""One process of ``bench.million``: one sync instance reads many customers, each once.

``python -m bench._million_child URL N BOUND CHUNK`` reads the balances of customers
``bench-million-0`` ... ``N-1`` (Redis already holds their state hashes: ``bench.million`` seeds
them) with ``max_customers`` at its default (``BOUND`` 0) or ``BOUND``; every ``CHUNK`` reads it
times ``CHUNK // 5`` bare ``HGETALL`` of state hashes on a client of its own (the load a cold read
makes of Redis, against which the machine's drift shows), and at each checkpoint it notes the
process's RSS. It prints one JSON line. Nothing else runs in the process, so RSS growth beyond
what it was after the instance's first read is the instance's.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from typing import Any

import redis

from bench._env import HEALTH_CHECK_INTERVAL
from bench._offline import METER
from outpost_sync import Outpost

WARM = "bench-million-warm"


def customer(i: int) -> str:
    return f"bench-million-{i}"


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def checkpoints(n: int) -> list[int]:
    """Read counts at which RSS is noted: each tenth, and 1,000, 10,000, 100,000 on the way."""
    marks = {n * k // 10 for k in range(1, 11)}
    marks |= {m for m in (1_000, 10_000, 100_000) if m < n}
    return sorted(m for m in marks if m > 0)


def main(url: str, n: int, bound: int, chunk: int) -> dict[str, Any]:
    options: dict[str, Any] = {"max_customers": bound} if bound else {}
    bare = redis.Redis.from_url(url, health_check_interval=HEALTH_CHECK_INTERVAL)
    with Outpost(redis_url=url, **options) as sdk:
        session = sdk._context.session
        read = sdk.balance
        read(METER, external_customer_id=WARM)  # started, subscribed: what follows is per customer
        warm_key = next(m.key for m in session.followed)
        gc.collect()
        baseline_rss = _rss()
        marks = checkpoints(n)
        notes: list[dict[str, Any]] = []
        chunks: list[dict[str, Any]] = []
        pc = time.perf_counter
        started = pc()
        i = 0
        while i < n:
            end = min(n, i + chunk)
            t0 = pc()
            for j in range(i, end):
                read(METER, external_customer_id=customer(j))
            t1 = pc()
            for _ in range(max(1, chunk // 5)):
                bare.hgetall(warm_key)
            t2 = pc()
            bare_reads = max(1, chunk // 5)
            chunks.append(
                {
                    "reads": end - i,
                    "seconds": t1 - t0,
                    "hgetall": bare_reads,
                    "hgetall_seconds": t2 - t1,
                }
            )
            i = end
            if marks and i >= marks[0]:
                marks.pop(0)
                gc.collect()
                notes.append(
                    {
                        "reads": i,
                        "rss_growth": _rss() - baseline_rss,
                        "followed": len(session.followed),
                        "allocated_blocks": sys.getallocatedblocks(),
                        "elapsed": pc() - started,
                    }
                )
        return {
            "n": n,
            "bound": session.settings.max_customers,
            "chunk": chunk,
            "baseline_rss": baseline_rss,
            "checkpoints": notes,
            "chunks": chunks,
            "rejections": dict(session.rejections),
        }


if __name__ == "__main__":
    url, n, bound, chunk = sys.argv[1], *(int(a) for a in sys.argv[2:5])
    print(json.dumps(main(url, n, bound, chunk)))
