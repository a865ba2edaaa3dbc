"""A snapshot's apply time against the number of pending events: how it grows.

``snapshot.apply.N`` (N = 1, 100, 10,000): each identity holds N pending events, acknowledged a
minute ago, spread over the last hour's twelve buckets; the snapshot's ``cold_until`` is the middle
of the hour and counts none of them, so half are in buckets the snapshot makes cold (kept:
acknowledged less than an hour ago; their buckets rebuilt) and half in hot ones.

``snapshot.hot.N`` (N = 10, 10,000): the same cold bucket each time (10 pending events, made cold
by the snapshot, none counted) beside N pending events in the hot buckets after it. Its cost
should not depend on N: the hot events are none of the snapshot's business.

Before each apply (untimed) the state hash's ``cu`` is set back to the hour's first bucket, so
every apply makes the same buckets cold again and does the whole work; every apply carries a
later ``as_of``, so none is stale, and the state after each is the state before it: repeated
applies cost the same.
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
SETUP_HOT = (
    "apply_snapshot as above on one identity: the snapshot makes one bucket of 10 pending "
    "acknowledged events cold (none counted: kept, the bucket rebuilt) while N pending events "
    "wait in the 6 hot buckets after it; cold_until is set back (untimed) before each apply."
)


def _events_key(state: str, bucket: int) -> str:
    """The events hash an event of ``bucket`` lives in (the layout's choice)."""
    return keys.bucket_key(state, bucket)


class Identity:
    """One identity: ``spread`` pending events over the hour's twelve buckets, cold_until in the
    middle (``snapshot.apply.N``), or 10 in the bucket made cold and ``hot`` in the hot buckets
    (``snapshot.hot.N``)."""

    def __init__(self, client: redis.Redis, name: str, now: int, spread: int, hot: int) -> None:
        self.client = client
        self.customer = Customer("external", f"bench-snapshot-{name}")
        self.state = keys.state_key(self.customer, REDUCER)
        self.channel = keys.channel(keys.shard_of(self.customer))
        self.current = floor_bucket(now)
        self.first = self.current - 11 * BUCKET_US
        self.cold = self.current - 6 * BUCKET_US
        self.as_of = now
        self.pending = spread + (10 if hot else 0) + hot
        acked = now - 60_000_000
        fields: list[tuple[int, str]] = []
        for n in range(spread):
            fields.append((self.first + (n % 12) * BUCKET_US, f"e{n:08d}"))
        if hot:
            fields += [(self.cold - BUCKET_US, f"c{n:08d}") for n in range(10)]
            fields += [(self.cold + (n % 6) * BUCKET_US, f"h{n:08d}") for n in range(hot)]
        self._fill(fields, acked)
        self.client.hset(self.state, "cu", self.first)
        self.apply()  # makes the state hash consistent with the events (counters, buckets)

    def _fill(self, fields: list[tuple[int, str]], acked: int) -> None:
        by_key: dict[str, dict[str, str]] = {}
        counts: dict[int, int] = {}
        for bucket, event_id in fields:
            mapping = by_key.setdefault(_events_key(self.state, bucket), {})
            mapping[f"{bucket}:{event_id}"] = f"1 {acked}"
            counts[bucket] = counts.get(bucket, 0) + 1
        pipe = self.client.pipeline(transaction=False)
        for bucket, count in counts.items():  # every event is worth 1
            pipe.hset(self.state, f"a:{bucket}", f"{count} {count} 1 1")
        for key, mapping in by_key.items():
            items = list(mapping.items())
            for start in range(0, len(items), 1000):
                pipe.hset(key, mapping=dict(items[start : start + 1000]))
                # every event acknowledged: indexed by when (none long enough ago to drop)
                pipe.zadd(
                    keys.acked_key(self.state),
                    dict.fromkeys(dict(items[start : start + 1000]), acked),
                )
        pipe.execute()
        n = sum(len(m) for m in by_key.values())
        self.client.hset(self.state, mapping={"n": n, "u": 0})

    def held(self) -> int:
        return sum(
            int(self.client.hlen(key))
            for key in {_events_key(self.state, self.first + b * BUCKET_US) for b in range(12)}
        )

    def rewind(self) -> None:
        """Set cold_until back to the hour's first bucket: the next apply makes them cold again."""
        self.client.hset(self.state, "cu", self.first)

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

    def script_keys(self) -> list[str]:
        return [self.state, keys.acked_key(self.state)]

    def apply(self) -> Any:
        script_keys = self.script_keys()
        return self.client.evalsha(
            SCRIPT_SHA1["apply_snapshot"], len(script_keys), *script_keys, *self.args()
        )


def _server_us(client: redis.Redis) -> float:
    stats: dict[str, Any] = client.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec_per_call", 0.0))


def _timed(client: redis.Redis, applies: int, call: Any, prepare: Any) -> tuple[list[int], float]:
    """``applies`` calls, each after ``prepare()`` (untimed); Redis's own µs per EVALSHA."""
    pc = time.perf_counter_ns
    out = [0] * applies
    client.config_resetstat()
    for i in range(applies):
        prepared = prepare()
        t0 = pc()
        call(prepared)
        out[i] = pc() - t0
    return out, _server_us(client)


def _evalsha(client: redis.Redis, identity: Identity) -> Any:
    script_keys = identity.script_keys()
    sha = SCRIPT_SHA1["apply_snapshot"]

    def prepare() -> list[Any]:
        identity.rewind()
        return identity.args()

    def call(arguments: list[Any]) -> Any:
        return client.evalsha(sha, len(script_keys), *script_keys, *arguments)

    return call, prepare


def run(env: Env) -> list[Figure]:
    env.reset()
    client = env.client()
    client.script_load(SCRIPT_TEXT["apply_snapshot"])
    trivial = str(client.script_load(TRIVIAL))
    now = time.time_ns() // 1000
    sizes = env.scale.snapshot_pending
    hot_sizes = env.scale.snapshot_hot
    identities = {n: Identity(client, str(n), now, n, 0) for n in sizes}
    hot = {n: Identity(client, f"hot-{n}", now, 0, n) for n in hot_sizes}
    everyone = [*identities.values(), *hot.values()]
    for identity in everyone:
        if identity.held() != identity.pending:
            raise RuntimeError(f"{identity.pending} pending events wanted, {identity.held()} held")
    applies = env.scale.snapshot_applies
    trivial_samples: list[list[int]] = []
    samples: dict[int, list[list[int]]] = {n: [] for n in sizes}
    hot_samples: dict[int, list[list[int]]] = {n: [] for n in hot_sizes}
    server: dict[int | str, list[float]] = {n: [] for n in sizes}
    hot_server: dict[int, list[float]] = {n: [] for n in hot_sizes}
    server["trivial"] = []
    for _ in range(env.scale.snapshot_rounds):
        gc.collect()
        out, us = _timed(client, applies, lambda _: client.evalsha(trivial, 0), lambda: None)
        server["trivial"].append(us)
        trivial_samples.append(out)
        for n, identity in identities.items():
            out, us = _timed(client, applies, *_evalsha(client, identity))
            server[n].append(us)
            samples[n].append(out)
        for n, identity in hot.items():
            out, us = _timed(client, applies, *_evalsha(client, identity))
            hot_server[n].append(us)
            hot_samples[n].append(out)
    for identity in everyone:
        if identity.held() != identity.pending:
            raise RuntimeError(f"applies changed the pending events: {identity.pending}")

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
    least = hot_sizes[0]
    for n in hot_sizes:
        base = hot_samples[least] if n != least else trivial_samples
        base_label = f"apply, {least} hot pending" if n != least else "EVALSHA `return 1`"
        figures.append(
            Figure(
                key=f"snapshot.hot.{n}",
                title=f"apply_snapshot making 10 events cold beside {n:,} hot pending events",
                unit="µs",
                subject=Side(
                    f"apply, {n} hot pending", [x for r in hot_samples[n] for x in ns_to_us(r)]
                ),
                baseline=Side(base_label, [x for r in base for x in ns_to_us(r)]),
                ratios=[round_ratio(s, b) for s, b in zip(hot_samples[n], base, strict=True)],
                ratio_meaning=(
                    f"apply p50 with {n} hot pending / with {least}, per round (growth; flat: 1)"
                    if n != least
                    else "apply p50 / EVALSHA `return 1` p50 per round"
                ),
                setup=SETUP_HOT,
                extra={
                    "hot_pending": n,
                    "cold_pending": 10,
                    "server_us": median(hot_server[n]),
                    "baseline_server_us": median(
                        hot_server[least] if n != least else server["trivial"]
                    ),
                },
            )
        )
    return figures
