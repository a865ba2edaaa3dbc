"""Redis's time to drop or confirm events one by one from one very large bucket.

``removal.confirm``: one bucket of 300,000 pending events (a count meter: every value 1), and
one ``confirm`` call removing 1,000 of them (delivery settles a dropped batch in one call). The
figure is Redis's own time for it (``INFO commandstats``), against 1,000 ``EVALSHA return 1``.
Target: under 20 ms (a script that counted the bucket again spent about half a second).

``removal.confirm.middle``: the same with distinct values (1 to 300,000), the events removed
being neither the bucket's min nor its max: the sum moves in place, the bucket is not read.

``removal.confirm.each``: the 1,000 events removed by 1,000 ``confirm`` calls of one event each
(Redis's time for all of them; no target: each call costs what any settle script costs).

Before each round (untimed) the removed events are put back and the bucket's aggregate restored.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import redis

from bench._env import Env
from bench._stats import Figure, Side, Target, median
from outpost_core import BUCKET_US, SCRIPT_SHA1, SCRIPT_TEXT, Customer, floor_bucket
from outpost_core import _keys as keys

REDUCER = "r-calls"
TRIVIAL = "return 1"
TARGET_MS = 20.0
SETUP = (
    "confirm (outpost_core.SCRIPT_TEXT) by EVALSHA removing K events (in one call, or one per "
    "call) of one bucket of N pending undelivered events; Redis's own time (INFO commandstats "
    "usec), against K EVALSHA `return 1`."
)


class Bucket:
    def __init__(self, client: redis.Redis, name: str, size: int, distinct: bool) -> None:
        self.client = client
        customer = Customer("external", f"bench-removal-{name}")
        self.state = keys.state_key(customer, REDUCER)
        self.acked = keys.acked_key(self.state)
        self.channel = keys.channel(keys.shard_of(customer))
        self.outbox = keys.outbox_key(keys.shard_of(customer))
        self.bucket = floor_bucket(time.time_ns() // 1000) - BUCKET_US
        self.events = keys.bucket_key(self.state, self.bucket)
        self.values = {
            f"{self.bucket}:e{n:07d}": str(n + 1 if distinct else 1) for n in range(size)
        }
        total = sum(int(v) for v in self.values.values())
        hi = size if distinct else 1
        self.aggregate = f"{size} {total} 1 {hi}"
        self.size = size
        items = list(self.values.items())
        pipe = client.pipeline(transaction=False)
        for start in range(0, size, 5000):
            pipe.hset(self.events, mapping=dict(items[start : start + 5000]))
        pipe.execute()
        self.restore([])

    def restore(self, removed: list[str]) -> None:
        if removed:
            self.client.hset(self.events, mapping={f: self.values[f] for f in removed})
        self.client.hset(
            self.state,
            mapping={"rev": 1, "n": self.size, "u": self.size, f"a:{self.bucket}": self.aggregate},
        )

    def victims(self, count: int) -> list[str]:
        """``count`` events from the middle of the bucket (never its min or max)."""
        step = max(1, (self.size - 2) // count)
        names = list(self.values)
        return [names[1 + i * step] for i in range(count)]

    def confirm(self, fields: list[str]) -> Any:
        return self.client.evalsha(
            SCRIPT_SHA1["confirm"], 3, self.outbox, self.state, self.acked,
            self.channel, "outpost", 0, 0, -1, len(fields), *fields,
        )  # fmt: skip


def _redis_ms(client: redis.Redis, calls: Any) -> float:
    """Redis's own milliseconds spent in EVALSHA while ``calls()`` runs."""
    client.config_resetstat()
    calls()
    stats: dict[str, Any] = client.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec", 0.0)) / 1000.0


def run(env: Env) -> list[Figure]:
    env.reset()
    client = env.client()
    client.script_load(SCRIPT_TEXT["confirm"])
    trivial = str(client.script_load(TRIVIAL))
    smoke = env.scale.name == "smoke"
    size, removals, rounds = (3_000, 100, 2) if smoke else (300_000, 1_000, 5)
    buckets = {
        "": Bucket(client, "flat", size, distinct=False),
        ".middle": Bucket(client, "middle", size, distinct=True),
        ".each": Bucket(client, "each", size, distinct=False),
    }
    baseline: list[float] = []
    subject: dict[str, list[float]] = {name: [] for name in buckets}
    for _ in range(rounds):
        gc.collect()
        baseline.append(
            _redis_ms(client, lambda: [client.evalsha(trivial, 0) for _ in range(removals)])
        )
        for name, bucket in buckets.items():
            victims = bucket.victims(removals)
            if name == ".each":
                calls = lambda b=bucket, v=victims: [b.confirm([f]) for f in v]  # noqa: E731
            else:
                calls = lambda b=bucket, v=victims: b.confirm(v)  # noqa: E731
            subject[name].append(_redis_ms(client, calls))
            if client.hlen(bucket.events) != size - removals:
                raise RuntimeError("confirm did not remove the events")
            bucket.restore(victims)
    figures = []
    for name in buckets:
        how = f"{removals:,} confirms of one event" if name == ".each" else "one confirm"
        kind = " (distinct values)" if name == ".middle" else ""
        figures.append(
            Figure(
                key=f"removal.confirm{name}",
                title=f"removing {removals:,} of {size:,} events of a bucket{kind}: {how}",
                unit="ms",
                subject=Side(f"{how} (Redis time)", subject[name]),
                baseline=Side(f"{removals} EVALSHA `return 1` (Redis time)", baseline),
                ratios=[s / b for s, b in zip(subject[name], baseline, strict=True)],
                ratio_meaning="Redis ms for the removal / for as many `return 1`, per round",
                setup=SETUP,
                target=None if name == ".each" else Target("p50", "<=", TARGET_MS),
                extra={
                    "bucket_events": size,
                    "removals": removals,
                    "median_ms": median(subject[name]),
                },
            )
        )
    return figures
