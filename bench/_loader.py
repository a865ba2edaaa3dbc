"""One tracking instance of the lag-under-load benchmark, in a process of its own: ``python -m
bench._loader DRIVER REDIS_URL SERVER_URL TOKEN METER HOT PROBE``.

It warms an instance (one read of HOT and of PROBE), says ``ready``, then for each line ``go
SECONDS`` tracks as fast as it can for that long: events for HOT back to back (sync: one thread;
async: ``TASKS`` tasks), and every few milliseconds one event for PROBE, noting the moment that
``track()`` returned (``perf_counter_ns``, CLOCK_MONOTONIC: the reader subtracts it from its own).
The k-th PROBE event since the start is the one that makes PROBE's consumed count reach k, so the
reader knows which event it sees. It answers each ``go`` with one JSON line: ``{"tracks": how many
HOT events, "probes": [[k, returned_ns], ...]}``. ``q`` quits.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

from bench._child import main_by_driver
from outpost_async import AsyncOutpost
from outpost_sync import Outpost

TASKS = 8  # async: concurrent tasks tracking HOT
EVENT = "api_call"


def probe_gap_ns() -> int:
    """Probes are 4-8 ms apart: a few hundred per tracker and second, a small share of the load."""
    return int(random.uniform(0.004, 0.008) * 1e9)


def _answer(tracks: int, probes: list[tuple[int, int]]) -> None:
    print(json.dumps({"tracks": tracks, "probes": probes}), flush=True)


def _sync(redis_url: str, server_url: str, token: str, meter: str, hot: str, probe: str) -> None:
    pc = time.perf_counter_ns
    probed = 0
    with Outpost(
        access_token=token, server_url=server_url, redis_url=redis_url, telemetry=False
    ) as sdk:
        sdk.balance(meter, external_customer_id=hot)
        sdk.balance(meter, external_customer_id=probe)
        print("ready", flush=True)
        for line in sys.stdin:
            command, _, seconds = line.strip().partition(" ")
            if command != "go":
                break
            tracks, probes = 0, []
            now = pc()
            end, next_probe = now + int(float(seconds) * 1e9), now + probe_gap_ns()
            while now < end:
                if now >= next_probe:
                    sdk.track(EVENT, external_customer_id=probe)
                    now = pc()
                    probed += 1
                    probes.append((probed, now))
                    next_probe = now + probe_gap_ns()
                else:
                    sdk.track(EVENT, external_customer_id=hot)
                    tracks += 1
                    now = pc()
            _answer(tracks, probes)


async def _async(
    redis_url: str, server_url: str, token: str, meter: str, hot: str, probe: str
) -> None:
    pc = time.perf_counter_ns
    loop = asyncio.get_running_loop()
    probed = 0
    async with AsyncOutpost(
        access_token=token, server_url=server_url, redis_url=redis_url, telemetry=False
    ) as sdk:
        await sdk.balance(meter, external_customer_id=hot)
        await sdk.balance(meter, external_customer_id=probe)
        print("ready", flush=True)
        while True:
            # Read commands off the loop, so the instance's own tasks keep running meanwhile.
            line = await loop.run_in_executor(None, sys.stdin.readline)
            command, _, seconds = line.strip().partition(" ")
            if command != "go":
                break
            end = pc() + int(float(seconds) * 1e9)
            tracked = [0] * TASKS
            probes: list[tuple[int, int]] = []

            async def flat_out(slot: int, end: int = end, tracked: list[int] = tracked) -> None:
                while pc() < end:
                    await sdk.track(EVENT, external_customer_id=hot)
                    tracked[slot] += 1

            async def probing(end: int = end, probes: list[tuple[int, int]] = probes) -> None:
                nonlocal probed
                while True:
                    await asyncio.sleep(probe_gap_ns() / 1e9)
                    if pc() >= end:
                        return
                    await sdk.track(EVENT, external_customer_id=probe)
                    returned = pc()
                    probed += 1
                    probes.append((probed, returned))

            await asyncio.gather(probing(), *(flat_out(slot) for slot in range(TASKS)))
            _answer(sum(tracked), probes)


def main() -> None:
    main_by_driver(_sync, _async)


if __name__ == "__main__":
    main()
