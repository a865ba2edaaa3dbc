"""One process of the admission contention benchmark (``bench/admission.py``): one AsyncOutpost,
TASKS tasks each asking OPS times for one unit of CUSTOMER; says ``ready`` once warm, starts on a
line from stdin, then prints how many asks were admitted.

    python -m bench._admitter REDIS_URL SERVER_URL TOKEN METER CUSTOMER MODE TASKS OPS

MODE: ``reserve`` (reserve one unit, commit one event), ``track`` (plain ``track()``), or
``exact`` (``reserve`` on the customer ``<CUSTOMER>-exact``, whose balance is limited).
"""

from __future__ import annotations

import asyncio
import sys

from outpost_async import AsyncOutpost, InsufficientBalance


async def main(argv: list[str]) -> None:
    redis_url, server_url, token, meter, customer, mode, tasks, ops = argv
    if mode == "exact":
        customer = f"{customer}-exact"
    admitted = 0
    async with AsyncOutpost(
        access_token=token, server_url=server_url, redis_url=redis_url, telemetry=False
    ) as sdk:
        await sdk.balance(meter, external_customer_id=customer)
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        await asyncio.to_thread(sys.stdin.readline)

        async def asks() -> None:
            nonlocal admitted
            for _ in range(int(ops)):
                if mode == "track":
                    await sdk.track("api_call", external_customer_id=customer)
                    admitted += 1
                    continue
                try:
                    r = await sdk.reserve(meter, 1, external_customer_id=customer)
                except InsufficientBalance:
                    continue
                await r.commit("api_call")
                admitted += 1

        await asyncio.gather(*(asks() for _ in range(int(tasks))))
        sys.stdout.write(f"admitted {admitted}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
