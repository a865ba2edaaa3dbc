"""The public-API mode against the emulator serving only Polar's public API: what following many
customers costs in requests to Polar, delivery included, and how far below the truth a steady
workload reads.

One async instance (``mode="auto"``, which switches to the public mode on the 404) follows N
customers: their first reads at once (each waits for its anchor: the instance asks for them a
hundred customers a request), then a steady workload tracks events for random customers while
delivery runs and the poll loop keeps every customer meter within ``poll_interval``. Every
request Polar receives (meters, customer meters, ingestion) is counted by the emulator; the
figure is the busiest minute (sliding, sampled each second), against Polar's 500 a minute.
At the end, with the workload still running, a sample of customers is read and compared with
what Polar would report if it recomputed now (the truth): the pessimism of the mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from typing import Any

from bench._emulator import EmulatorProcess
from bench._env import CALLS_FILTER, Env
from bench._stats import Figure, Side, within_polars_limit
from outpost_async import AsyncOutpost

SETUP = (
    "Emulator serving only the public API (recompute {recompute} s after a customer's last "
    "ingest); one AsyncOutpost (mode auto, requests_per_minute 300, poll_interval {poll} s, "
    "public_margin {margin} s); {n} customers of one count meter read at once, then {rate} "
    "events/s tracked for random customers for {seconds} s, delivery on. Requests: every HTTP "
    "request the emulator served, busiest 60 s (sliding, sampled every second; the whole run "
    "when shorter). Pessimism: truth (a recompute now) minus the local balance, {sample} "
    "customers read at the end of the workload."
)
FULL = {"n": 10_000, "rate": 50.0, "seconds": 120.0, "poll": 60.0, "sample": 500}
SMOKE = {"n": 100, "rate": 20.0, "seconds": 4.0, "poll": 2.0, "sample": 20}
MARGIN = 60.0
READS_AT_ONCE = 200
"""First reads waiting together (each waiting read looks again at every change: thousands at
once cost the event loop more than the requests they wait for)."""
RECOMPUTE = 15.0


def run(env: Env) -> list[Figure]:
    env.reset()
    scale = SMOKE if env.scale.name == "smoke" else FULL
    with EmulatorProcess(public_only=True, recompute_delays=(RECOMPUTE, 10800.0)) as emu:
        meter = emu.create_meter("calls", CALLS_FILTER, {"func": "count"})
        result = asyncio.run(_measure(env, emu, meter, scale))
    return _figures(scale, result)


def _requests(emu: EmulatorProcess) -> int:
    counters: dict[str, int] = emu.state()["counters"]
    return sum(
        v
        for k, v in counters.items()
        if k.startswith("http_") and k not in ("http_admin", "http_rate_limited")
    )


async def _measure(
    env: Env, emu: EmulatorProcess, meter: str, scale: dict[str, Any]
) -> dict[str, Any]:
    customers = [f"public-{i}" for i in range(int(scale["n"]))]
    instance = AsyncOutpost(
        access_token=emu.token,
        server_url=emu.url,
        redis_url=env.url,
        telemetry=False,
        snapshot_timeout=300.0,
        poll_interval=scale["poll"],
        public_margin=MARGIN,
    )
    samples: list[tuple[float, int]] = []
    stop = asyncio.Event()

    async def count() -> None:
        while not stop.is_set():
            samples.append((time.monotonic(), await asyncio.to_thread(_requests, emu)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async with instance:
        counting = asyncio.create_task(count())
        started = time.monotonic()
        # One read first: the mode found out and the configuration read, the rest at once.
        await instance.balance(meter, external_customer_id=customers[0])
        for i in range(0, len(customers), READS_AT_ONCE):
            chunk = customers[i : i + READS_AT_ONCE]
            await asyncio.gather(*(instance.balance(meter, external_customer_id=c) for c in chunk))
        first_reads_s = time.monotonic() - started
        steady_from = len(samples)
        rng = random.Random(7)
        interval = 1.0 / scale["rate"]
        tracked = 0
        deadline = time.monotonic() + scale["seconds"]
        while time.monotonic() < deadline:
            await instance.track("api_call", external_customer_id=rng.choice(customers))
            tracked += 1
            await asyncio.sleep(interval)
        gaps = []
        for customer in rng.sample(customers, int(scale["sample"])):
            truth = await asyncio.to_thread(emu.customer_meter, meter, customer)
            local = await instance.balance(meter, external_customer_id=customer)
            gaps.append(float(truth["balance"]) - local.balance)
        stop.set()
        await counting
        flushed = await instance.flush()
        status = instance.status
        outcomes = dict(instance._public.anchors.outcomes)
    counters = emu.state()["counters"]
    return {
        "peak": _busiest_minute(samples[steady_from:] or samples),
        "first_reads_peak": _busiest_minute(samples[: steady_from + 1]),
        "first_reads_s": first_reads_s,
        "tracked": tracked,
        "gaps": gaps,
        "flushed": flushed,
        "mode": status.mode,
        "outcomes": outcomes,
        "responses_429": counters.get("http_rate_limited", 0),
        "customer_meter_requests": counters.get("http_customer_meters", 0),
        "ingest_requests": counters.get("http_ingest", 0),
        "meters_requests": counters.get("http_meters", 0),
    }


def _busiest_minute(samples: list[tuple[float, int]]) -> float:
    """Requests a minute over the busiest 60 s (the whole span when shorter)."""
    if len(samples) < 2:
        return 0.0
    (first_t, first_c), (last_t, last_c) = samples[0], samples[-1]
    if last_t - first_t < 60.0:
        return (last_c - first_c) * 60.0 / max(last_t - first_t, 1e-9)
    best, j = 0.0, 0
    for t0, c0 in samples:
        while j < len(samples) and samples[j][0] - t0 < 60.0:
            j += 1
        if j == len(samples):
            break
        t1, c1 = samples[j]
        best = max(best, (c1 - c0) * 60.0 / (t1 - t0))
    return best


def _figures(scale: dict[str, Any], result: dict[str, Any]) -> list[Figure]:
    setup = SETUP.format(
        recompute=RECOMPUTE,
        poll=scale["poll"],
        margin=MARGIN,
        n=f"{int(scale['n']):,}",
        rate=scale["rate"],
        seconds=scale["seconds"],
        sample=scale["sample"],
    )
    gaps = result.pop("gaps")
    per_customer = scale["rate"] / scale["n"]
    margin_units = per_customer * MARGIN
    return [
        within_polars_limit(
            key="public.requests",
            title=f"public mode, {int(scale['n']):,} customers: requests a minute to Polar",
            subject="every request, busiest minute",
            per_minute=result["peak"],
            ratio_meaning="requests a minute / Polar's limit (at most 1)",
            setup=setup,
            extra=result,
        ),
        Figure(
            key="public.pessimism",
            title="public mode, steady workload: truth - local balance",
            unit="units",
            subject=Side("truth - local", gaps),
            baseline=Side("a customer's usage within the margin", [margin_units]),
            ratios=[statistics.mean(gaps) / margin_units if margin_units else float("nan")],
            ratio_meaning="mean gap / (usage rate per customer x margin)",
            setup=setup,
            extra={"max_gap": max(gaps, default=0.0), "negative": sum(g < 0 for g in gaps)},
        ),
    ]
