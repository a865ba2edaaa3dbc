"""A process that asks for admission many times at once, for the tests of exact admission across
processes. It warms up (reads the customer's balance), says ``ready``, waits for a line on stdin
so that every process starts together, then runs WORKERS threads (or asyncio tasks) that each
ask once for one unit, and says ``admitted A refused R``.

    python -m tests.support.admit_child REDIS_URL SERVER_URL TOKEN METER MODE WORKERS

MODE: ``reserve`` (reserve one unit, then commit one ``api_call``), ``track`` (one
``track(require_balance=True)``), ``async-reserve`` / ``async-track`` (the same with the async
driver's tasks), or ``hold`` (reserve WORKERS units with a ttl of 2 s, say ``held``, then hang:
the test kills it).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from outpost_async import AsyncOutpost
from outpost_core import InsufficientBalance
from outpost_sync import Outpost

ROOT = Path(__file__).resolve().parents[2]
CUSTOMER = "c1"


def start(
    redis_url: str, server_url: str, token: str, meter: str, mode: str, workers: int
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", __name__, redis_url, server_url, token, meter, mode, str(workers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def run_sync(args: list[str]) -> None:
    redis_url, server_url, token, meter, mode, workers = args
    outpost = Outpost(
        access_token=token, server_url=server_url, redis_url=redis_url, telemetry=False, linger=0.02
    )
    outpost.balance(meter, external_customer_id=CUSTOMER)
    if mode == "hold":
        outpost.reserve(meter, int(workers), external_customer_id=CUSTOMER, ttl=2.0)
        say("held")
        time.sleep(3600)
    say("ready")
    sys.stdin.readline()
    counts = {"admitted": 0, "refused": 0}
    lock = threading.Lock()

    def one() -> None:
        try:
            if mode == "reserve":
                with outpost.reserve(meter, 1, external_customer_id=CUSTOMER) as reservation:
                    reservation.commit("api_call")
            else:
                outpost.track("api_call", external_customer_id=CUSTOMER, require_balance=True)
            outcome = "admitted"
        except InsufficientBalance:
            outcome = "refused"
        with lock:
            counts[outcome] += 1

    threads = [threading.Thread(target=one) for _ in range(int(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outpost.flush(30)
    say(f"admitted {counts['admitted']} refused {counts['refused']}")
    outpost.close()


async def run_async(args: list[str]) -> None:
    redis_url, server_url, token, meter, mode, workers = args
    outpost = AsyncOutpost(
        access_token=token, server_url=server_url, redis_url=redis_url, telemetry=False, linger=0.02
    )
    await outpost.balance(meter, external_customer_id=CUSTOMER)
    say("ready")
    await asyncio.to_thread(sys.stdin.readline)
    counts = {"admitted": 0, "refused": 0}

    async def one() -> None:
        try:
            if mode == "async-reserve":
                reservation = await outpost.reserve(meter, 1, external_customer_id=CUSTOMER)
                async with reservation:
                    await reservation.commit("api_call")
            else:
                await outpost.track("api_call", external_customer_id=CUSTOMER, require_balance=True)
            counts["admitted"] += 1
        except InsufficientBalance:
            counts["refused"] += 1

    await asyncio.gather(*(one() for _ in range(int(workers))))
    assert await outpost.flush(30)
    say(f"admitted {counts['admitted']} refused {counts['refused']}")
    await outpost.close()


def main() -> None:
    args = sys.argv[1:]
    if args[4].startswith("async-"):
        asyncio.run(run_async(args))
    else:
        run_sync(args)


if __name__ == "__main__":
    main()
