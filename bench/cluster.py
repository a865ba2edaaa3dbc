"""Redis Cluster beside one Redis (issue 16): sync ``track()``, a warm ``balance()`` and the lag
from one instance's ``track()`` to another's warm read, each on a 3 + 3 cluster against the same
on the run's single Redis, in interleaved rounds; and what ``durability="replica"`` costs a
``track()`` on the cluster (``WAIT 1`` after each event)."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench._env import Env
from bench._offline import METER, prepare
from bench._stats import Figure, Side, ns_to_us, round_ratio
from outpost_emulator.redis_server import RedisCluster
from outpost_sync import Outpost

CUSTOMER = "bench-cluster"
SETUP = (
    "No Polar: the configuration is stored in Redis and a snapshot applied with the "
    "apply_snapshot script (instances without an access token: nothing is delivered). Cluster: "
    "3 primaries + 3 replicas on loopback (outpost_emulator.redis_server.RedisCluster), the "
    "instance built from redis+cluster://; single: the run's redis-server. Sync driver, the "
    "customer warm. Lag: two instances in this process, one tracks, the other polls its warm "
    "balance() until it counts the event (the GIL is shared: both sides pay it)."
)


def run(env: Env) -> list[Figure]:
    env.reset()
    prepare(env.client(), CUSTOMER)
    cluster = RedisCluster()
    cluster.start()
    try:
        prepare(cluster.client(), CUSTOMER)
        return _measure(env, cluster)
    finally:
        cluster.close()


def _measure(env: Env, cluster: RedisCluster) -> list[Figure]:
    scale = env.scale
    rounds, ops = scale.track_rounds, scale.track_ops
    samples: dict[str, list[list[int]]] = {}
    with (
        _instance(env.url) as single,
        _instance(env.url) as single_reader,
        _instance(cluster.url) as clustered,
        _instance(cluster.url) as cluster_reader,
        _instance(cluster.url, durability="replica") as durable,
    ):
        sides = {
            "single": (single, single_reader),
            "cluster": (clustered, cluster_reader),
        }
        for _ in range(rounds):
            for name, (tracker, reader) in sides.items():
                samples.setdefault(f"track.{name}", []).append(_tracks(tracker, ops))
                samples.setdefault(f"read.{name}", []).append(_reads(reader, ops))
                samples.setdefault(f"lag.{name}", []).append(
                    _lags(tracker, reader, max(2, scale.lag_samples // 5))
                )
            samples.setdefault("track.durable", []).append(_tracks(durable, ops))
    return [
        _figure("cluster.track", "track() sync", samples, "track", "µs"),
        _figure("cluster.balance", "warm balance() sync", samples, "read", "µs"),
        _figure("cluster.lag", "track() → another instance's warm read", samples, "lag", "µs"),
        Figure(
            key="cluster.track.replica",
            title='durability="replica" track() vs track() on the cluster',
            unit="µs",
            subject=Side("track() replica", _flat(samples["track.durable"])),
            baseline=Side("track() primary", _flat(samples["track.cluster"])),
            ratios=_ratios(samples["track.cluster"], samples["track.durable"]),
            ratio_meaning="replica p50 / primary p50 per round (the cost of WAIT 1)",
            setup=SETUP,
        ),
    ]


def _figure(key: str, title: str, samples: dict[str, Any], kind: str, unit: str) -> Figure:
    single, cluster = samples[f"{kind}.single"], samples[f"{kind}.cluster"]
    return Figure(
        key=key,
        title=f"{title}: cluster vs one Redis",
        unit=unit,
        subject=Side("cluster", _flat(cluster)),
        baseline=Side("one Redis", _flat(single)),
        ratios=_ratios(single, cluster),
        ratio_meaning="cluster p50 / one Redis p50 per round",
        setup=SETUP,
    )


def _flat(rounds: list[list[int]]) -> list[float]:
    return [x for r in rounds for x in ns_to_us(r)]


def _ratios(baseline: list[list[int]], subject: list[list[int]]) -> list[float]:
    # round_ratio(numerator, denominator) is numerator p50 / denominator p50
    return [round_ratio(s, b) for b, s in zip(baseline, subject, strict=True)]


@contextlib.contextmanager
def _instance(url: str, **options: Any) -> Iterator[Outpost]:
    with Outpost(redis_url=url, telemetry=False, **options) as sdk:
        sdk.balance(METER, external_customer_id=CUSTOMER)  # warm, following
        yield sdk


def _timed(call: Callable[[], Any], count: int) -> list[int]:
    gc.collect()
    pc = time.perf_counter_ns
    out = [0] * count
    for i in range(count):
        t0 = pc()
        call()
        out[i] = pc() - t0
    return out


def _tracks(sdk: Outpost, count: int) -> list[int]:
    return _timed(lambda: sdk.track("api_call", external_customer_id=CUSTOMER), count)


def _reads(sdk: Outpost, count: int) -> list[int]:
    return _timed(lambda: sdk.balance(METER, external_customer_id=CUSTOMER), count)


def _lags(tracker: Outpost, reader: Outpost, count: int) -> list[int]:
    out = []
    for _ in range(count):
        before = reader.balance(METER, external_customer_id=CUSTOMER).consumed
        tracker.track("api_call", external_customer_id=CUSTOMER)
        returned = time.perf_counter_ns()
        deadline = time.monotonic() + 5
        while reader.balance(METER, external_customer_id=CUSTOMER).consumed == before:
            if time.monotonic() > deadline:
                raise RuntimeError("the reader did not see the event within 5 s")
            time.sleep(0)
        out.append(time.perf_counter_ns() - returned)
    return out
