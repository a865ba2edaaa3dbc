"""Warm ``balance()`` against one redis-py ``GET``, sync and async (target: at least 300× faster
with telemetry on), telemetry on (``balance.*``) and off (``balance.*.telemetry_off``), and what
telemetry adds to a warm read (``balance.*.telemetry``: at most 0.15 µs)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench._emulator import EmulatorProcess
from bench._env import Env
from bench._stats import Figure, Side, Target, ns_to_us, round_ratio
from bench._timing import timed_calls, timed_calls_async
from outpost_async import AsyncOutpost
from outpost_sync import Outpost

CUSTOMER = "bench-balance"
GET_KEY = "bench:get"
GET_VALUE = b"x" * 64
TARGET = Target(on="ratio", op=">=", value=300.0)
TELEMETRY_TARGET = Target(on="delta", op="<=", value=0.15)
SETUP = (
    "Emulator (own process) on loopback, count meter, credits granted; two instances (telemetry "
    "on, exporting through the emulator's relay, and off) warmed by a first read. Each round "
    "times GETs, then the telemetry-on instance's reads, then the other's. The baseline GET runs "
    "on the very client (same pool, same parser) passed to the SDK as redis=. Each GET is timed "
    "alone with perf_counter_ns; reads are timed in batches of 50 (one read costs about as much "
    "as reading the clock twice), each sample the batch's time over 50, loop included."
)


def run(env: Env) -> list[Figure]:
    emu, meter = env.start(CUSTOMER, credits=1_000_000)
    sync = _sync(env, emu, meter)
    asynchronous = asyncio.run(_async(env, emu, meter))
    return [*sync, *asynchronous]


class _Rounds:
    """Each round's timed GETs and timed reads (by telemetry), and how many batches of reads saw
    the cached balance recomputed meanwhile (``cold_reads``)."""

    def __init__(self) -> None:
        self.gets: list[list[int]] = []
        self.reads: dict[bool, list[list[float]]] = {True: [], False: []}
        self.misses = 0

    def add_reads(self, telemetry: bool, reads: list[float], missed: bool) -> None:
        self.reads[telemetry].append(reads)
        self.misses += missed


def _figures(driver: str, rounds: _Rounds) -> list[Figure]:
    figures = []
    for telemetry in (True, False):
        reads = rounds.reads[telemetry]
        suffix = "" if telemetry else ".telemetry_off"
        figures.append(
            Figure(
                key=f"balance.{driver}{suffix}",
                title=f"warm balance() {driver}, telemetry {'on' if telemetry else 'off'} "
                "vs redis-py GET",
                unit="µs",
                subject=Side(f"balance() {driver}", [x for r in reads for x in ns_to_us(r)]),
                baseline=Side(f"GET {driver}", [x for r in rounds.gets for x in ns_to_us(r)]),
                ratios=[round_ratio(g, b) for g, b in zip(rounds.gets, reads, strict=True)],
                ratio_meaning="GET p50 / balance() p50 per round (how many times faster)",
                setup=SETUP,
                target=TARGET,
                extra={"cold_reads": rounds.misses, "telemetry": telemetry},
            )
        )
    on, off = figures
    figures.append(
        Figure(
            key=f"balance.{driver}.telemetry",
            title=f"warm balance() {driver}: telemetry on vs off",
            unit="µs",
            subject=Side(f"balance() {driver}, telemetry on", on.subject.samples),
            baseline=Side(f"balance() {driver}, telemetry off", off.subject.samples),
            ratios=[
                round_ratio(a, b)
                for a, b in zip(rounds.reads[True], rounds.reads[False], strict=True)
            ],
            ratio_meaning="telemetry-on p50 / telemetry-off p50 per round; the target is on "
            "the difference of the p50s (µs telemetry adds to a warm read)",
            setup=SETUP,
            target=TELEMETRY_TARGET,
        )
    )
    return figures


def _instance(emu: EmulatorProcess, client: Any, telemetry: bool) -> dict[str, Any]:
    return dict(access_token=emu.token, server_url=emu.url, redis=client, telemetry=telemetry)


# The timed reads call balance() directly (as bench._timing's loops do: a wrapper's call would be
# timed too), so each driver has its own; the async one mirrors the sync one line for line. A warm
# read costs about as much as reading the clock twice (perf_counter_ns is 50-150 ns a call on these
# VMs), so a read timed alone would be half timer: each sample is a batch of BATCH reads timed
# together, divided by BATCH. The loop's own cost stays in (it is counted against the SDK).
BATCH = 50


def _timed_reads(read: Callable[..., Any], meter: str, ops: int) -> tuple[list[float], bool]:
    """``ops`` warm reads in batches, the ns per read of each batch; whether the cached balance
    was recomputed meanwhile."""
    pc = time.perf_counter_ns
    gc.collect()
    out = [0.0] * (ops // BATCH)
    batch = range(BATCH)
    first = read(meter, external_customer_id=CUSTOMER)
    for i in range(len(out)):
        t0 = pc()
        for _ in batch:
            read(meter, external_customer_id=CUSTOMER)
        out[i] = (pc() - t0) / BATCH
    return out, read(meter, external_customer_id=CUSTOMER) is not first


async def _timed_reads_async(
    read: Callable[..., Awaitable[Any]], meter: str, ops: int
) -> tuple[list[float], bool]:
    pc = time.perf_counter_ns
    gc.collect()
    out = [0.0] * (ops // BATCH)
    batch = range(BATCH)
    first = await read(meter, external_customer_id=CUSTOMER)
    for i in range(len(out)):
        t0 = pc()
        for _ in batch:
            await read(meter, external_customer_id=CUSTOMER)
        out[i] = (pc() - t0) / BATCH
    return out, await read(meter, external_customer_id=CUSTOMER) is not first


def _sync(env: Env, emu: EmulatorProcess, meter: str) -> list[Figure]:
    client = env.client()
    client.set(GET_KEY, GET_VALUE)
    scale = env.scale
    rounds = _Rounds()
    with (
        Outpost(**_instance(emu, client, True)) as on,
        Outpost(**_instance(emu, client, False)) as off,
    ):
        sdks = {True: on, False: off}
        for sdk in sdks.values():
            sdk.balance(meter, external_customer_id=CUSTOMER)
        for _ in range(scale.balance_rounds):
            rounds.gets.append(timed_calls(client.get, GET_KEY, scale.get_ops))
            for telemetry, sdk in sdks.items():
                rounds.add_reads(telemetry, *_timed_reads(sdk.balance, meter, scale.balance_ops))
    return _figures("sync", rounds)


async def _async(env: Env, emu: EmulatorProcess, meter: str) -> list[Figure]:
    client = env.async_client()
    await client.set(GET_KEY, GET_VALUE)
    scale = env.scale
    rounds = _Rounds()
    try:
        async with (
            AsyncOutpost(**_instance(emu, client, True)) as on,
            AsyncOutpost(**_instance(emu, client, False)) as off,
        ):
            sdks = {True: on, False: off}
            for sdk in sdks.values():
                await sdk.balance(meter, external_customer_id=CUSTOMER)
            for _ in range(scale.balance_rounds):
                rounds.gets.append(await timed_calls_async(client.get, GET_KEY, scale.get_ops))
                for telemetry, sdk in sdks.items():
                    timed = await _timed_reads_async(sdk.balance, meter, scale.balance_ops)
                    rounds.add_reads(telemetry, *timed)
    finally:
        await client.aclose()
    return _figures("async", rounds)
