"""Redis Cluster beside one Redis: sync ``track()``, a warm ``balance()`` and the lag
from one instance's ``track()`` to another's warm read, each on a 3 + 3 cluster against the same
on one Redis with one replica (as each shard of the cluster has), in interleaved rounds; the
cluster's ``track()`` against the run's single Redis without a replica too
(``cluster.track.unreplicated``: on a machine of few cores, a replica applying every write
competes with the primary and the client for them); and what ``durability="replica"`` costs a
``track()`` on the cluster (``WAIT 1`` after each event)."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis

from bench._env import Env
from bench._offline import METER, prepare
from bench._stats import Figure, Side, Target, ns_to_us, round_ratio
from outpost_emulator.redis_server import RedisServer
from outpost_sync import Outpost
from tests.support.redis_cluster import RedisCluster, RedisReplica

CUSTOMER = "bench-cluster"
TRACK_TARGET = Target(on="ratio", op="<=", value=1.2)
SETUP = (
    "No Polar: the configuration is stored in Redis and a snapshot applied with the "
    "apply_snapshot script (instances without an access token: nothing is delivered). Cluster: "
    "3 primaries + 3 replicas on loopback (tests/support/redis_cluster.py), the "
    "instance built from redis+cluster://; single: a redis-server with one replica (the "
    "unreplicated row: the run's redis-server, no replica). Sync driver, the "
    "customer warm. Lag: two instances in this process, one tracks, the other polls its warm "
    "balance() until it counts the event (the GIL is shared: both sides pay it)."
)


def run(env: Env) -> list[Figure]:
    env.reset()
    prepare(env.client(), CUSTOMER)
    cluster = RedisCluster()
    primary = RedisServer()
    replica = RedisReplica(primary)
    try:
        cluster.start()
        primary.start()
        replica.start()
        replica.wait_in_sync()
        prepare(cluster.client(), CUSTOMER)
        replicated = redis.Redis(port=primary.port)
        try:
            prepare(replicated, CUSTOMER)
        finally:
            replicated.close()
        return _measure(env, cluster, primary.url)
    finally:
        replica.close()
        primary.close()
        cluster.close()


def _measure(env: Env, cluster: RedisCluster, replicated_url: str) -> list[Figure]:
    scale = env.scale
    rounds, ops = scale.track_rounds, scale.track_ops
    samples: dict[str, list[list[int]]] = {}
    with (
        _instance(replicated_url) as single,
        _instance(replicated_url) as single_reader,
        _instance(cluster.url) as clustered,
        _instance(cluster.url) as cluster_reader,
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
    # Each instance only while it is measured: an idle one still hears every change of the
    # customer it follows, on this process's threads, and slows whatever is measured beside it.
    with _instance(env.url) as bare, _instance(cluster.url) as clustered:
        for _ in range(rounds):
            samples.setdefault("track.unreplicated", []).append(_tracks(bare, ops))
            samples.setdefault("track.clustered", []).append(_tracks(clustered, ops))
    with (
        _instance(cluster.url) as clustered,
        _instance(cluster.url, durability="replica") as durable,
    ):
        for _ in range(rounds):
            samples.setdefault("track.primary", []).append(_tracks(clustered, ops))
            samples.setdefault("track.durable", []).append(_tracks(durable, ops))
    return [
        _figure("cluster.track", "track() sync", samples, "track", TRACK_TARGET),
        _figure("cluster.balance", "warm balance() sync", samples, "read"),
        _figure("cluster.lag", "track() → another instance's warm read", samples, "lag"),
        _versus(
            "cluster.track.unreplicated",
            "track() sync: cluster vs one Redis without a replica",
            samples,
            subject=("cluster", "track.clustered"),
            baseline=("one Redis, no replica", "track.unreplicated"),
            meaning="cluster p50 / one Redis (no replica) p50 per round",
        ),
        _versus(
            "cluster.track.replica",
            'durability="replica" track() vs track() on the cluster',
            samples,
            subject=("track() replica", "track.durable"),
            baseline=("track() primary", "track.primary"),
            meaning="replica p50 / primary p50 per round (the cost of WAIT 1)",
        ),
    ]


def _figure(
    key: str, title: str, samples: dict[str, Any], kind: str, target: Target | None = None
) -> Figure:
    """The cluster's ``kind`` samples against one Redis with a replica."""
    return _versus(
        key,
        f"{title}: cluster vs one Redis",
        samples,
        subject=("cluster", f"{kind}.cluster"),
        baseline=("one Redis with a replica", f"{kind}.single"),
        meaning="cluster p50 / one Redis (with a replica) p50 per round",
        target=target,
    )


def _versus(
    key: str,
    title: str,
    samples: dict[str, Any],
    *,
    subject: tuple[str, str],
    baseline: tuple[str, str],
    meaning: str,
    target: Target | None = None,
) -> Figure:
    """Two of the samples, each named (its label, its key in ``samples``), in µs: the ratio is
    the subject's p50 over the baseline's, round by round."""
    (subject_label, subject_key), (baseline_label, baseline_key) = subject, baseline
    return Figure(
        key=key,
        title=title,
        unit="µs",
        subject=Side(subject_label, _flat(samples[subject_key])),
        baseline=Side(baseline_label, _flat(samples[baseline_key])),
        ratios=_ratios(samples[baseline_key], samples[subject_key]),
        ratio_meaning=meaning,
        setup=SETUP,
        target=target,
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
