"""Warm ``balance()`` against one redis-py ``GET``, sync and async (D10: at least 100× faster)."""

from __future__ import annotations

import asyncio
import gc
import time

from bench._emulator import EmulatorProcess
from bench._env import Env
from bench._stats import Figure, Side, Target, ns_to_us, round_ratio
from outpost_async import AsyncOutpost
from outpost_sync import Outpost

CUSTOMER = "bench-balance"
GET_KEY = "bench:get"
GET_VALUE = b"x" * 64
TARGET = Target(on="ratio", op=">=", value=100.0)
SETUP = (
    "Emulator (own process) on loopback, count meter, credits granted; one instance warmed by a "
    "first read. The baseline GET runs on the very client (same pool, same parser) passed to "
    "the SDK as redis=. Each call is timed alone with perf_counter_ns (the timer's own cost is "
    "included on both sides)."
)


def run(env: Env) -> list[Figure]:
    env.reset()
    emu, meter = env.emulator, env.meter
    emu.grant_credits(meter, 1_000_000, external_customer_id=CUSTOMER)
    sync = _sync(env, emu, meter)
    asynchronous = asyncio.run(_async(env, emu, meter))
    return [sync, asynchronous]


def _figure(
    key: str, driver: str, gets: list[list[int]], reads: list[list[int]], misses: int
) -> Figure:
    return Figure(
        key=key,
        title=f"warm balance() {driver} vs redis-py GET",
        unit="µs",
        subject=Side(f"balance() {driver}", [x for r in reads for x in ns_to_us(r)]),
        baseline=Side(f"GET {driver}", [x for r in gets for x in ns_to_us(r)]),
        ratios=[round_ratio(g, b) for g, b in zip(gets, reads, strict=True)],
        ratio_meaning="GET p50 / balance() p50 per round (how many times faster)",
        setup=SETUP,
        target=TARGET,
        extra={"cold_reads": misses},
    )


def _sync(env: Env, emu: EmulatorProcess, meter: str) -> Figure:
    client = env.client()
    client.set(GET_KEY, GET_VALUE)
    scale = env.scale
    gets: list[list[int]] = []
    reads: list[list[int]] = []
    misses = 0
    with Outpost(access_token=emu.token, server_url=emu.url, redis=client, telemetry=False) as sdk:
        sdk.balance(meter, external_customer_id=CUSTOMER)
        pc = time.perf_counter_ns
        get = client.get
        read = sdk.balance
        for _ in range(scale.balance_rounds):
            gc.collect()
            out = [0] * scale.get_ops
            for i in range(scale.get_ops):
                t0 = pc()
                get(GET_KEY)
                out[i] = pc() - t0
            gets.append(out)
            gc.collect()
            out = [0] * scale.balance_ops
            first = read(meter, external_customer_id=CUSTOMER)
            for i in range(scale.balance_ops):
                t0 = pc()
                read(meter, external_customer_id=CUSTOMER)
                out[i] = pc() - t0
            if read(meter, external_customer_id=CUSTOMER) is not first:
                misses += 1  # the cached balance was recomputed during the round
            reads.append(out)
    return _figure("balance.sync", "sync", gets, reads, misses)


async def _async(env: Env, emu: EmulatorProcess, meter: str) -> Figure:
    client = env.async_client()
    await client.set(GET_KEY, GET_VALUE)
    scale = env.scale
    gets: list[list[int]] = []
    reads: list[list[int]] = []
    misses = 0
    try:
        async with AsyncOutpost(
            access_token=emu.token,
            server_url=emu.url,
            redis=client,
            telemetry=False,
        ) as sdk:
            await sdk.balance(meter, external_customer_id=CUSTOMER)
            pc = time.perf_counter_ns
            get = client.get
            read = sdk.balance
            for _ in range(scale.balance_rounds):
                gc.collect()
                out = [0] * scale.get_ops
                for i in range(scale.get_ops):
                    t0 = pc()
                    await get(GET_KEY)
                    out[i] = pc() - t0
                gets.append(out)
                gc.collect()
                out = [0] * scale.balance_ops
                first = await read(meter, external_customer_id=CUSTOMER)
                for i in range(scale.balance_ops):
                    t0 = pc()
                    await read(meter, external_customer_id=CUSTOMER)
                    out[i] = pc() - t0
                if await read(meter, external_customer_id=CUSTOMER) is not first:
                    misses += 1
                reads.append(out)
    finally:
        await client.aclose()
    return _figure("balance.async", "async", gets, reads, misses)
