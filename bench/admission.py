"""Exact admission against ``track()`` (target: ``reserve()`` and ``commit()`` each at most 1.2x a
``track()``), and admission under contention: 8 processes of 64 tasks each admitting for one
customer, against the same processes tracking.

Per-call rows, sync and async (one task), in interleaved rounds: ``track()`` (the baseline), then
``reserve()`` of one unit followed by its ``commit()`` (each timed alone), then
``track(require_balance=True)``. The customer is warm and its balance never runs out.

Contention: each round starts 8 processes (``bench/_admitter.py``), each with one async instance
and 64 tasks, all on one customer, that either reserve one unit and commit it, or ``track()``;
the figure is the admissions per second over the tracks per second of the same round. A last
round gives the customer a balance of exactly half the asks: the JSON counts what was admitted
(it must be that balance, no more)."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._emulator import EmulatorProcess
from bench._env import Env
from bench._stats import Figure, Side, Target, median, ns_to_us, round_ratio
from outpost_async import AsyncOutpost
from outpost_sync import Outpost

CUSTOMER = "bench-admission"
CONTENDED = "bench-admission-contended"
TARGET = Target(on="ratio", op="<=", value=1.2)
PROCESSES = 8
TASKS = 64
ROOT = Path(__file__).resolve().parent.parent
SETUP = (
    "The emulator (own process) is Polar; the instance has its access token, telemetry off, "
    "and the customer is warm with a balance that never runs out. Interleaved rounds: "
    "track() (baseline), then reserve() of one unit and its commit() of one event (each timed "
    "alone), then track(require_balance=True). Each call timed alone."
)


class _Rounds:
    def __init__(self) -> None:
        self.track: list[list[int]] = []
        self.reserve: list[list[int]] = []
        self.commit: list[list[int]] = []
        self.required: list[list[int]] = []


def run(env: Env) -> list[Figure]:
    emu, meter = env.start(CUSTOMER, CONTENDED, credits=1_000_000_000)
    figures = _figures("sync", _sync(env, emu, meter))
    figures += _figures("async", asyncio.run(_async(env, emu, meter)))
    figures.append(_contention(env, emu, meter))
    return figures


def _figures(driver: str, rounds: _Rounds) -> list[Figure]:
    out = []
    for name, samples in (
        ("reserve", rounds.reserve),
        ("commit", rounds.commit),
        ("require_balance", rounds.required),
    ):
        out.append(
            Figure(
                key=f"admission.{name}.{driver}",
                title=f"{name} {driver} vs track()",
                unit="µs",
                subject=Side(f"{name} {driver}", [x for r in samples for x in ns_to_us(r)]),
                baseline=Side(f"track() {driver}", [x for r in rounds.track for x in ns_to_us(r)]),
                ratios=[round_ratio(s, b) for s, b in zip(samples, rounds.track, strict=True)],
                ratio_meaning=f"{name} p50 / track() p50 per round (time, lower is better)",
                setup=SETUP,
                target=TARGET if name != "require_balance" else None,
            )
        )
    return out


def _sync(env: Env, emu: EmulatorProcess, meter: str) -> _Rounds:
    ops, rounds = env.scale.track_ops, _Rounds()
    pc = time.perf_counter_ns
    client = env.client()
    with Outpost(access_token=emu.token, server_url=emu.url, redis=client, telemetry=False) as sdk:
        sdk.balance(meter, external_customer_id=CUSTOMER)
        for _ in range(env.scale.track_rounds):
            gc.collect()
            track, reserve, commit, required = ([0] * ops for _ in range(4))
            for i in range(ops):
                t0 = pc()
                sdk.track("api_call", external_customer_id=CUSTOMER)
                track[i] = pc() - t0
            for i in range(ops):
                t0 = pc()
                r = sdk.reserve(meter, 1, external_customer_id=CUSTOMER)
                t1 = pc()
                r.commit("api_call")
                reserve[i], commit[i] = t1 - t0, pc() - t1
            for i in range(ops):
                t0 = pc()
                sdk.track("api_call", external_customer_id=CUSTOMER, require_balance=True)
                required[i] = pc() - t0
            rounds.track.append(track)
            rounds.reserve.append(reserve)
            rounds.commit.append(commit)
            rounds.required.append(required)
    return rounds


async def _async(env: Env, emu: EmulatorProcess, meter: str) -> _Rounds:
    ops, rounds = env.scale.track_ops, _Rounds()
    pc = time.perf_counter_ns
    client = env.async_client()
    try:
        async with AsyncOutpost(
            access_token=emu.token, server_url=emu.url, redis=client, telemetry=False
        ) as sdk:
            await sdk.balance(meter, external_customer_id=CUSTOMER)
            for _ in range(env.scale.track_rounds):
                gc.collect()
                track, reserve, commit, required = ([0] * ops for _ in range(4))
                for i in range(ops):
                    t0 = pc()
                    await sdk.track("api_call", external_customer_id=CUSTOMER)
                    track[i] = pc() - t0
                for i in range(ops):
                    t0 = pc()
                    r = await sdk.reserve(meter, 1, external_customer_id=CUSTOMER)
                    t1 = pc()
                    await r.commit("api_call")
                    reserve[i], commit[i] = t1 - t0, pc() - t1
                for i in range(ops):
                    t0 = pc()
                    await sdk.track("api_call", external_customer_id=CUSTOMER, require_balance=True)
                    required[i] = pc() - t0
                rounds.track.append(track)
                rounds.reserve.append(reserve)
                rounds.commit.append(commit)
                rounds.required.append(required)
    finally:
        await client.aclose()
    return rounds


def _fleet(env: Env, emu: EmulatorProcess, meter: str, mode: str, ops: int) -> tuple[float, int]:
    """8 processes of 64 tasks, each task ``ops`` asks: (asks a second, admitted)."""
    command = [sys.executable, "-m", "bench._admitter", env.url, emu.url, emu.token, meter]
    logs = [tempfile.TemporaryFile() for _ in range(PROCESSES)]  # noqa: SIM115 - closed below
    children = [
        subprocess.Popen(
            [*command, CONTENDED, mode, str(TASKS), str(ops)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=ROOT,
        )
        for log in logs
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
    started = time.perf_counter()
    for child in children:
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        child.stdin.flush()
    admitted = 0
    for child, log in zip(children, logs, strict=True):
        assert child.stdout is not None and child.stdin is not None
        out = child.stdout.read()
        child.wait(timeout=600)
        child.stdin.close()
        child.stdout.close()
        log.seek(0)
        errors = log.read().decode(errors="replace")
        log.close()
        if child.returncode != 0 or not out.startswith(b"admitted"):
            raise RuntimeError(f"an admitting process failed: {errors[-2000:]}")
        admitted += int(out.split()[-1])
    elapsed = time.perf_counter() - started
    return PROCESSES * TASKS * ops / elapsed, admitted


def _contention(env: Env, emu: EmulatorProcess, meter: str) -> Figure:
    ops = max(1, env.scale.track_concurrent_ops // (PROCESSES * TASKS))
    admitting: list[float] = []
    tracking: list[float] = []
    for _ in range(max(1, env.scale.track_rounds // 5)):
        tracking.append(_fleet(env, emu, meter, "track", ops)[0])
        admitting.append(_fleet(env, emu, meter, "reserve", ops)[0])
    asks = PROCESSES * TASKS * ops
    # Exactness: a fresh customer whose balance covers half the asks.
    emu.grant_credits(meter, asks // 2, external_customer_id=f"{CONTENDED}-exact")
    _, admitted = _fleet(env, emu, meter, "exact", ops)
    return Figure(
        key="admission.contention",
        title=f"reserve+commit vs track(), {PROCESSES} processes x {TASKS} tasks, one customer",
        unit="asks/s",
        subject=Side("reserve+commit", admitting),
        baseline=Side("track()", tracking),
        ratios=[a / t for a, t in zip(admitting, tracking, strict=True)],
        ratio_meaning="admissions/s over tracks/s per round (rate, higher is better)",
        setup=(
            f"{PROCESSES} processes, one AsyncOutpost each, {TASKS} tasks each doing {ops} asks "
            "for one customer, started together; wall time from the start signal to the last "
            "process done (delivery included in neither)."
        ),
        extra={
            "asks_per_round": asks,
            "exact_balance": asks // 2,
            "exact_admitted": admitted,
            "median_admissions_per_s": median(admitting),
        },
    )
