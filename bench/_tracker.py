"""The tracking side of the lag benchmark, in a process of its own (as another instance of an
application would be): ``python -m bench._tracker DRIVER REDIS_URL SERVER_URL TOKEN METER CUSTOMER
KEY``.

It warms an instance, says ``ready``, then answers each line it reads: ``t`` tracks one event
(for CUSTOMER, or for the customer named after it: ``t other-customer``), ``i`` increments KEY
with a bare redis-py client (the baseline's write), and each is answered with
``time.perf_counter_ns()`` taken the moment the call returned. On Linux that clock is
CLOCK_MONOTONIC, the same in every process, so the parent can subtract it from its own. ``q`` quits.
"""

from __future__ import annotations

import asyncio
import sys
import time

import redis
import redis.asyncio

from bench._child import main_by_driver
from bench._env import HEALTH_CHECK_INTERVAL
from outpost_async import AsyncOutpost
from outpost_sync import Outpost


def _sync(redis_url: str, server_url: str, token: str, meter: str, customer: str, key: str) -> None:
    publisher = redis.Redis.from_url(redis_url, health_check_interval=HEALTH_CHECK_INTERVAL)
    with Outpost(
        access_token=token, server_url=server_url, redis_url=redis_url, telemetry=True
    ) as sdk:
        sdk.balance(meter, external_customer_id=customer)
        publisher.ping()
        print("ready", flush=True)
        for line in sys.stdin:
            command, _, named = line.strip().partition(" ")
            if command == "t":
                sdk.track("api_call", external_customer_id=named or customer)
            elif command == "i":
                publisher.incr(key)
            else:
                break
            print(time.perf_counter_ns(), flush=True)
    publisher.close()


async def _async(
    redis_url: str, server_url: str, token: str, meter: str, customer: str, key: str
) -> None:
    loop = asyncio.get_running_loop()
    publisher = redis.asyncio.Redis.from_url(redis_url, health_check_interval=HEALTH_CHECK_INTERVAL)
    async with AsyncOutpost(
        access_token=token, server_url=server_url, redis_url=redis_url, telemetry=True
    ) as sdk:
        await sdk.balance(meter, external_customer_id=customer)
        await publisher.ping()
        print("ready", flush=True)
        while True:
            # Read commands off the loop, so the instance's own tasks keep running meanwhile.
            line = await loop.run_in_executor(None, sys.stdin.readline)
            command, _, named = line.strip().partition(" ")
            if command == "t":
                await sdk.track("api_call", external_customer_id=named or customer)
            elif command == "i":
                await publisher.incr(key)
            else:
                break
            print(time.perf_counter_ns(), flush=True)
    await publisher.aclose()


def main() -> None:
    main_by_driver(_sync, _async)


if __name__ == "__main__":
    main()
