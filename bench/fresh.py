"""``balance(..., fresh=True)`` against one redis-py ``HGETALL`` of the same state hash, sync and
async (one Redis round trip, never behind Redis; target: at most 1.3× the bare read)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter

from bench._emulator import EmulatorProcess
from bench._env import Env, reducer_of
from bench._stats import Figure, Side, Target, ns_to_us, round_ratio
from bench._timing import timed_calls, timed_calls_async
from outpost_async import AsyncOutpost
from outpost_core import Customer
from outpost_core import _keys as keys
from outpost_sync import Outpost

CUSTOMER = "bench-fresh"
EVENTS = 20  # pending events in the customer's state, spread over buckets as tracked
TARGET = Target(on="ratio", op="<=", value=1.3)
SETUP = (
    "Emulator (own process) on loopback, count meter, credits granted, {e} events tracked for "
    "the customer (its state hash holds Polar's snapshot and the pending aggregates); one "
    "instance warmed by a first read. Subject: balance(..., fresh=True), which reads the state "
    "hash (HGETALL) and computes the balance from it. Baseline: HGETALL of the same key on the "
    "very client passed to the SDK as redis=, in interleaved rounds. Each call timed alone."
)


def run(env: Env) -> list[Figure]:
    emu, meter = env.start(CUSTOMER, credits=1_000_000)
    key = keys.state_key(Customer("external", CUSTOMER), reducer_of(emu, meter))
    sync = _sync(env, emu, meter, key)
    asynchronous = asyncio.run(_async(env, emu, meter, key))
    return [sync, asynchronous]


class _Rounds:
    """Each round's timed HGETALLs and fresh reads, and where the fresh reads were answered from."""

    def __init__(self) -> None:
        self.bare: list[list[int]] = []
        self.fresh: list[list[int]] = []
        self.sources: Counter[str] = Counter()


def _figure(driver: str, rounds: _Rounds, fields: int) -> Figure:
    bare, fresh, sources = rounds.bare, rounds.fresh, rounds.sources
    return Figure(
        key=f"fresh.{driver}",
        title=f"balance(fresh=True) {driver} vs redis-py HGETALL of the same key",
        unit="µs",
        subject=Side(f"balance(fresh=True) {driver}", [x for r in fresh for x in ns_to_us(r)]),
        baseline=Side(f"HGETALL {driver}", [x for r in bare for x in ns_to_us(r)]),
        ratios=[round_ratio(f, b) for f, b in zip(fresh, bare, strict=True)],
        ratio_meaning="fresh balance() p50 / HGETALL p50 per round (time, lower is better)",
        setup=SETUP.format(e=EVENTS),
        target=TARGET,
        extra={
            "state_hash_fields": fields,
            "fresh_reads_from_redis": sources["redis"],
            "fresh_reads_from_memory": sources["memory"],
        },
    )


def _sync(env: Env, emu: EmulatorProcess, meter: str, key: str) -> Figure:
    client = env.client()
    scale = env.scale
    rounds = _Rounds()
    with Outpost(access_token=emu.token, server_url=emu.url, redis=client, telemetry=False) as sdk:
        sdk.balance(meter, external_customer_id=CUSTOMER)
        for _ in range(EVENTS):
            sdk.track("api_call", external_customer_id=CUSTOMER)
        fields = len(client.hgetall(key))
        pc = time.perf_counter_ns
        read = sdk.balance
        for _ in range(scale.fresh_rounds):
            rounds.bare.append(timed_calls(client.hgetall, key, scale.fresh_ops))
            gc.collect()
            out = [0] * scale.fresh_ops
            for i in range(scale.fresh_ops):
                t0 = pc()
                found = read(meter, external_customer_id=CUSTOMER, fresh=True)
                out[i] = pc() - t0
                rounds.sources[found.source] += 1
            rounds.fresh.append(out)
    return _figure("sync", rounds, fields)


async def _async(env: Env, emu: EmulatorProcess, meter: str, key: str) -> Figure:
    client = env.async_client()
    scale = env.scale
    rounds = _Rounds()
    try:
        async with AsyncOutpost(
            access_token=emu.token, server_url=emu.url, redis=client, telemetry=False
        ) as sdk:
            await sdk.balance(meter, external_customer_id=CUSTOMER)
            for _ in range(EVENTS):
                await sdk.track("api_call", external_customer_id=CUSTOMER)
            fields = len(await client.hgetall(key))
            pc = time.perf_counter_ns
            read = sdk.balance
            for _ in range(scale.fresh_rounds):
                rounds.bare.append(await timed_calls_async(client.hgetall, key, scale.fresh_ops))
                gc.collect()
                out = [0] * scale.fresh_ops
                for i in range(scale.fresh_ops):
                    t0 = pc()
                    found = await read(meter, external_customer_id=CUSTOMER, fresh=True)
                    out[i] = pc() - t0
                    rounds.sources[found.source] += 1
                rounds.fresh.append(out)
    finally:
        await client.aclose()
    return _figure("async", rounds, fields)
