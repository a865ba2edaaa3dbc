"""A fleet sharing Polar's rate limit: processes tracking together against the emulator's limit.

Each process (``_fleet_tracker.py``) runs one instance with default settings (a shared budget of
300 requests a minute) and tracks as fast as it can for the run's seconds, then flushes. The
emulator, in its own process, enforces Polar's 500 requests a minute per organization. The
figures: requests a minute the fleet sent (against the limit), and the delay from ``track()``
to Polar storing the event; the JSON adds events tracked a second, 429s and drops (targets 0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._emulator import EmulatorProcess
from bench._env import CALLS_FILTER, Env
from bench._stats import POLAR_LIMIT, Figure, Side, within_polars_limit

ROOT = Path(__file__).resolve().parent.parent
BUDGET = 300  # the SDK's default share of Polar's limit (POLAR_LIMIT)
SETUP = (
    "{p} processes, each one sync instance with default settings, track as fast as they can "
    "for {s:g} s (100 events per loop over 50 customers), then flush; the emulator (its own "
    "process) enforces {limit} requests a minute. Requests a minute = the emulator's ingest "
    "requests over the time from the start to the last flush. Delay = the event's timestamp "
    "(taken by track()) to its storage by the emulator, sampled."
)


def _start(env: Env, emu: EmulatorProcess, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench._fleet_tracker", env.url, emu.url, emu.token, str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def run(env: Env) -> list[Figure]:
    env.reset()
    processes, seconds = env.scale.fleet_processes, env.scale.fleet_seconds
    with EmulatorProcess(sync_delay=1.0, rate_limit=POLAR_LIMIT) as emu:
        emu.create_meter("calls", CALLS_FILTER, {"func": "count"})
        children = [_start(env, emu, seconds) for _ in range(processes)]
        results: list[dict[str, Any]] = []
        try:
            for child in children:
                assert child.stdout is not None
                if child.stdout.readline().strip() != "ready":
                    raise RuntimeError("a fleet process did not start")
            before = emu.state()["counters"]
            start = time.perf_counter()
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            for child in children:
                assert child.stdout is not None
                results.append(json.loads(child.stdout.readline()))
            elapsed = time.perf_counter() - start
        finally:
            for child in children:
                child.wait(timeout=60)
        state = emu.state()
        delays = emu.ingest_delays()
    counters = state["counters"]
    requests = counters.get("http_ingest", 0) - before.get("http_ingest", 0)
    per_minute = requests * 60 / elapsed
    tracked = sum(r["tracked"] for r in results)
    extra = {
        "processes": processes,
        "seconds": seconds,
        "events_tracked": tracked,
        "events_per_s_tracked": tracked / max(r["s"] for r in results),
        "events_stored": state["events"]["count"],
        "requests": requests,
        "responses_429": counters.get("http_rate_limited", 0),
        "events_dropped": sum(r["dropped"] for r in results),
        "flushed": all(r["flushed"] for r in results),
        "run_s": elapsed,
    }
    setup = SETUP.format(p=processes, s=seconds, limit=POLAR_LIMIT)
    sample = [float(d) for d in delays["sample_ms"]]
    interval = 60_000 / BUDGET
    return [
        within_polars_limit(
            key="fleet",
            title=f"fleet of {processes}: requests a minute sent",
            subject="ingest requests a minute",
            per_minute=per_minute,
            ratio_meaning="requests a minute / Polar's limit (at most 1: no 429)",
            setup=setup,
            extra=extra,
        ),
        Figure(
            key="fleet.delay",
            title="fleet: track() → stored by Polar",
            unit="ms",
            subject=Side("track → stored", sample),
            baseline=Side("the budget's interval between two requests", [interval]),
            ratios=[s / interval for s in sample] or [float("nan")],
            ratio_meaning="delay / the budget's interval between two requests of the fleet",
            setup=setup,
            extra={"events": delays["count"]},
        ),
    ]
