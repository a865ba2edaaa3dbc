"""``python -m bench [--smoke] [--json PATH] [--only NAME ...] [--check]``."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import (
    admission,
    balance,
    cluster,
    delivery,
    failover,
    fleet,
    following,
    fresh,
    lag,
    lag_load,
    memory,
    million,
    public,
    removal,
    snapshot,
    track,
)
from bench._env import FULL, SMOKE, Env, machine
from bench._report import legend, table, write_json
from bench._stats import Figure

RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"
BENCHMARKS: dict[str, Callable[[Env], list[Figure]]] = {
    "balance": balance.run,
    "track": track.run,
    "lag": lag.run,
    "lag_load": lag_load.run,
    "fresh": fresh.run,
    "memory": memory.run,
    "delivery": delivery.run,
    "snapshot": snapshot.run,
    "removal": removal.run,
    "failover": failover.run,
    "fleet": fleet.run,
    "cluster": cluster.run,
    "following": following.run,
    "million": million.run,
    "admission": admission.run,
    "public": public.run,
}
# Every figure a complete run produces (the smoke test checks them all).
EXPECTED = (
    "balance.sync",
    "balance.sync.telemetry_off",
    "balance.sync.telemetry",
    "balance.async",
    "balance.async.telemetry_off",
    "balance.async.telemetry",
    "track.sync",
    "track.sync.throughput",
    "track.sync.telemetry_off",
    "track.sync.throughput.telemetry_off",
    "track.sync.telemetry",
    "track.async.c1",
    "track.async.c1.throughput",
    "track.async.c1.telemetry_off",
    "track.async.c1.throughput.telemetry_off",
    "track.async.c1.telemetry",
    "track.async.c64",
    "track.async.c64.throughput",
    "track.async.c64.telemetry_off",
    "track.async.c64.throughput.telemetry_off",
    "track.async.c64.telemetry",
    "track.script_redis",
    "lag.sync",
    "lag.async",
    "lag.sync.first_touch",
    "lag.async.first_touch",
    "lag.sync.new_instance",
    "lag.async.new_instance",
    "lag_under_load.sync",
    "lag_under_load.async",
    "lag_under_load.sync.reader_tracks",
    "lag_under_load.async.reader_tracks",
    "fresh.sync",
    "fresh.async",
    "memory.process",
    "memory.redis_identity_hour",
    "delivery.sync",
    "delivery.async",
    "delivery.sync.polar_20ms",
    "delivery.async.polar_20ms",
    "snapshot.apply.1",
    "snapshot.apply.100",
    "snapshot.apply.10000",
    "snapshot.hot.10",
    "snapshot.hot.10000",
    "removal.confirm",
    "removal.confirm.middle",
    "removal.confirm.each",
    "failover",
    "fleet",
    "fleet.delay",
    "cluster.track",
    "cluster.balance",
    "cluster.lag",
    "cluster.track.replica",
    "cluster.track.unreplicated",
    *(
        f"following.{row}.200"
        for row in ("rss", "tick", "next_deadline", "reconnect_requests", "restart_loads")
    ),
    "million.rss",
    "million.read_rate",
    "admission.reserve.sync",
    "admission.commit.sync",
    "admission.require_balance.sync",
    "admission.reserve.async",
    "admission.commit.async",
    "admission.require_balance.async",
    "admission.contention",
    "public.requests",
    "public.pessimism",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny counts: seconds, no targets")
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"default: {RESULTS}")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a target is missed (full runs)"
    )
    args = parser.parse_args(argv)

    # The SDK falls back on these; a benchmark says what it connects to.
    for name in ("POLAR_ACCESS_TOKEN", "POLAR_SERVER_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    # What the instances log (warnings: reconnections, retries) goes to a file beside the JSON.
    log_path = args.json.with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.WARNING,
        filename=log_path,
        filemode="w",
        format="%(asctime)s %(threadName)s %(name)s %(levelname)s: %(message)s",
    )

    scale = SMOKE if args.smoke else FULL
    names = args.only or list(BENCHMARKS)
    figures: list[Figure] = []
    errors: dict[str, str] = {}
    started = time.monotonic()
    with Env(scale) as env:
        info = machine(env)
        print(f"outpost bench ({scale.name}): {info['cpu']} ×{info['cpus']}, "
              f"Python {info['python']}, redis-server {info['redis_server']}, "
              f"hiredis {info['hiredis'] or 'absent'}", flush=True)  # fmt: skip
        for name in names:
            t0 = time.monotonic()
            print(f"  {name} ...", end="", flush=True)
            try:
                produced = BENCHMARKS[name](env)
            except Exception:
                errors[name] = traceback.format_exc()
                print(" FAILED", flush=True)
                print(errors[name], file=sys.stderr, flush=True)
                continue
            figures += produced
            print(f" {time.monotonic() - t0:.1f} s", flush=True)
    elapsed = time.monotonic() - started
    if hasattr(os, "getloadavg"):
        info["load_average_at_end"] = list(os.getloadavg())

    print()
    print(table(figures))
    print()
    print(legend(figures))
    document: dict[str, Any] = {
        "schema": 1,
        "mode": scale.name,
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "duration_s": round(elapsed, 1),
        "machine": info,
        "figures": {f.key: f.to_json() for f in figures},
        "errors": errors,
    }
    write_json(args.json, document)
    print(f"\n{len(figures)} figures in {elapsed:.1f} s; JSON: {args.json}; log: {log_path}")
    if errors:
        return 1
    if args.check and not args.smoke and any(f.met is False for f in figures):
        return 1
    return 0
