"""A snapshot's apply time against the number of pending events (1, 100, 10,000): how it grows.

Each identity holds N pending events, acknowledged a minute ago, spread over the last hour's
twelve buckets; the snapshot's ``cold_until`` is the middle of the hour and counts none of them,
so half are in cold buckets (kept: acknowledged less than an hour ago; their buckets rebuilt) and
half in hot ones. Every apply carries a later ``as_of``, so none is stale and each does the whole
work, and the state after each is the state before it: repeated applies cost the same.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import redis

from bench._env import Env
from bench._stats import Figure, Side, median, ns_to_us, round_ratio
from outpost_core import BUCKET_US, SCRIPT_SHA1, SCRIPT_TEXT, Aggregate, Customer, floor_bucket
from outpost_core import _keys as keys

REDUCER = "r-calls"
METER = "m-calls"
HOUR_US = 3_600_000_000
TRIVIAL = "return 1"
SETUP = (
    "apply_snapshot (outpost_core.SCRIPT_TEXT) run by EVALSHA on a redis-py client, timed at the "
    "client (round trip included); N pending acknowledged events over 12 buckets, cold_until in "
    "the middle, none counted, so each apply reads, keeps and re-aggregates them all. "
    "server_us: Redis's own time per call (INFO commandstats)."
)


class Identity:
    def __init__(self, client: redis.Redis, pending: int, now: int) -> None:
        self.client = client
        self.customer = Customer("external", f"bench-snapshot-{pending}")
        self.state = keys.state_key(self.customer, REDUCER)
        self.events = keys.events_key(self.state)
        self.channel = keys.channel(self.customer.shard)
        self.current = floor_bucket(now)
        self.cold = self.current - 6 * BUCKET_US
        self.as_of = now
        self._fill(pending, now)
        self.apply()  # makes the state hash consistent with the events (counters, buckets)

    def _fill(self, pending: int, now: int) -> None:
        acked = now - 60_000_000
        fields: dict[str, str] = {}
        for n in range(pending):
            bucket = self.current - (11 - n % 12) * BUCKET_US
            fields[f"{bucket}:e{n:08d}"] = f"1 {acked}"
        pipe = self.client.pipeline(transaction=False)
        items = list(fields.items())
        for start in range(0, len(items), 1000):
            pipe.hset(self.events, mapping=dict(items[start : start + 1000]))
        pipe.execute()

    def args(self) -> list[Any]:
        self.as_of += 1
        return [
            self.channel,
            self.as_of,
            HOUR_US,
            self.cold,
            self.as_of,
            f"s-{self.as_of}",
            1,
            METER,
            1_000_000,
            -1,
            Aggregate().encode(),
            0,
        ]

    def apply(self) -> Any:
        return self.client.evalsha(
            SCRIPT_SHA1["apply_snapshot"], 2, self.state, self.events, *self.args()
        )


def _server_us(client: redis.Redis) -> float:
    stats: dict[str, Any] = client.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec_per_call", 0.0))


def run(env: Env) -> list[Figure]:
    env.reset()
    client = env.client()
    client.script_load(SCRIPT_TEXT["apply_snapshot"])
    trivial = str(client.script_load(TRIVIAL))
    now = time.time_ns() // 1000
    sizes = env.scale.snapshot_pending
    identities = {n: Identity(client, n, now) for n in sizes}
    for n, identity in identities.items():
        held = int(client.hlen(identity.events))
        if held != n:
            raise RuntimeError(f"{n} pending events wanted, {held} held")
    applies = env.scale.snapshot_applies
    pc = time.perf_counter_ns
    trivial_samples: list[list[int]] = []
    samples: dict[int, list[list[int]]] = {n: [] for n in sizes}
    server: dict[int | str, list[float]] = {n: [] for n in sizes}
    server["trivial"] = []
    for _ in range(env.scale.snapshot_rounds):
        gc.collect()
        out = [0] * applies
        client.config_resetstat()
        for i in range(applies):
            t0 = pc()
            client.evalsha(trivial, 0)
            out[i] = pc() - t0
        server["trivial"].append(_server_us(client))
        trivial_samples.append(out)
        for n, identity in identities.items():
            out = [0] * applies
            client.config_resetstat()
            for i in range(applies):
                arguments = identity.args()
                t0 = pc()
                client.evalsha(
                    SCRIPT_SHA1["apply_snapshot"], 2, identity.state, identity.events, *arguments
                )
                out[i] = pc() - t0
            server[n].append(_server_us(client))
            samples[n].append(out)
    for n, identity in identities.items():
        held = int(client.hlen(identity.events))
        if held != n:
            raise RuntimeError(f"applies changed the pending events: {n} -> {held}")

    figures = []
    smallest = sizes[0]
    base_server: int | str
    for n in sizes:
        if n == smallest:
            base, base_label, base_server = trivial_samples, "EVALSHA `return 1`", "trivial"
            meaning = "apply p50 / EVALSHA `return 1` p50 per round"
        else:
            base, base_label, base_server = (
                samples[smallest],
                f"apply, {smallest} pending",
                smallest,
            )
            meaning = f"apply p50 with {n} pending / with {smallest} pending, per round (growth)"
        per_event = (
            [
                (median(s) - median(b)) / (n - smallest) / 1000.0
                for s, b in zip(samples[n], samples[smallest], strict=True)
            ]
            if n != smallest
            else []
        )
        figures.append(
            Figure(
                key=f"snapshot.apply.{n}",
                title=f"apply_snapshot with {n:,} pending events",
                unit="µs",
                subject=Side(f"apply, {n} pending", [x for r in samples[n] for x in ns_to_us(r)]),
                baseline=Side(base_label, [x for r in base for x in ns_to_us(r)]),
                ratios=[round_ratio(s, b) for s, b in zip(samples[n], base, strict=True)],
                ratio_meaning=meaning,
                setup=SETUP,
                extra={
                    "pending": n,
                    "server_us": median(server[n]),
                    "baseline_server_us": median(server[base_server]),
                    "us_per_pending_event": median(per_event) if per_event else None,
                },
            )
        )
    return figures
