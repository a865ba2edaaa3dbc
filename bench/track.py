"""``track()`` against a bare redis-py ``EVALSHA`` of a trivial script at the same concurrency
(D10: at most 1.2× its time, at least 0.8× its throughput): sync, async at 1 and 64 tasks."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import redis
import redis.asyncio

from bench._env import Env
from bench._stats import Figure, Side, Target, median, ns_to_us, round_ratio
from outpost_async import AsyncOutpost
from outpost_core import (
    SCRIPT_SHA1,
    Aggregate,
    ConfigurationReceived,
    Customer,
    RunScript,
    Session,
    floor_bucket,
)
from outpost_sync import Outpost
from tests.support import polar

METER = "m-calls"
CUSTOMER = "bench-track"
RAW_CUSTOMER = "bench-track-raw"
TRIVIAL = "return 1"
CONFIGURATION = polar.configuration(
    polar.reducer(
        "r-calls", [METER], clauses=[{"property": "name", "operator": "eq", "value": "api_call"}]
    )
)
TIME_TARGET = Target(on="ratio", op="<=", value=1.2)
RATE_TARGET = Target(on="ratio", op=">=", value=0.8)
SETUP = (
    "No Polar: the configuration (one count reducer) is stored in Redis and a snapshot applied "
    "with the apply_snapshot script; the instance has no access token, so it delivers nothing "
    "and the events queue in the outbox (no delivery competes with the measurement). The "
    "customer is warm (followed), as in an application that reads its balance. Baseline: "
    "EVALSHA of `return 1` (0 keys) on the client passed to the SDK as redis=."
)


def run(env: Env) -> list[Figure]:
    env.reset()
    client = env.client()
    _prepare(client)
    trivial = str(client.script_load(TRIVIAL))
    figures = _sync(env, client, trivial)
    figures += asyncio.run(_async(env, trivial, tasks=1, ops=env.scale.track_ops))
    figures += asyncio.run(_async(env, trivial, tasks=64, ops=env.scale.track_concurrent_ops))
    return figures


def _prepare(client: redis.Redis) -> None:
    polar.store_configuration(client, CONFIGURATION)
    now = time.time_ns() // 1000
    for name in (CUSTOMER, RAW_CUSTOMER):
        polar.apply_snapshot(
            client,
            Customer("external", name),
            cold_until=floor_bucket(now),
            as_of=now,
            now=now,
            totals={"r-calls": Aggregate()},
            credited={METER: 1e12},
        )


def _raw_runs(count: int) -> Iterator[RunScript]:
    """The track script's KEYS and ARGV as the core builds them, for fresh event ids, so that
    it can be run bare (the caller follows no identity: the reply carries only the revision)."""
    session = Session()
    session.handle(ConfigurationReceived(CONFIGURATION, from_cache=True))
    for _ in range(count):
        now = time.time_ns() // 1000
        yield session.track(
            name="api_call",
            external_customer_id=RAW_CUSTOMER,
            timestamp_us=now,
            now_us=now,
            event_id=uuid.uuid4().hex,
        )


def _raw_call(evalsha: Callable[..., Any], count: int) -> Callable[[], Any]:
    """A call of the bare track script with the next precomputed KEYS and ARGV (sync or async,
    as ``evalsha`` is)."""
    runs = iter([(r.keys, r.args) for r in _raw_runs(count)])
    sha = SCRIPT_SHA1["track"]

    def call() -> Any:
        keys, args = next(runs)
        return evalsha(sha, len(keys), *keys, *args)

    return call


def _figures(
    mode: str,
    tasks: int,
    bases: list[list[int]],
    subjects: list[list[int]],
    raws: list[list[int]],
    base_walls: list[float],
    subject_walls: list[float],
    ops: int,
) -> list[Figure]:
    label = f"{mode}, {tasks} task{'s' if tasks > 1 else ''}" if mode == "async" else "sync"
    key = "track.sync" if mode == "sync" else f"track.async.c{tasks}"
    extra = {
        "tasks": tasks,
        "ops_per_round": ops,
        "track_lua_alone_p50_us": median([x for r in raws for x in ns_to_us(r)]),
        "track_lua_alone_ratio": median(
            [round_ratio(r, b) for r, b in zip(raws, bases, strict=True)]
        ),
        "track_lua_alone_note": "EVALSHA of the real track script with KEYS/ARGV precomputed by "
        "outpost_core.Session (JSON encoding done outside the timing), caller following nothing",
    }
    time_figure = Figure(
        key=key,
        title=f"track() {label} vs EVALSHA",
        unit="µs",
        subject=Side(f"track() {label}", [x for r in subjects for x in ns_to_us(r)]),
        baseline=Side(f"EVALSHA {label}", [x for r in bases for x in ns_to_us(r)]),
        ratios=[round_ratio(s, b) for s, b in zip(subjects, bases, strict=True)],
        ratio_meaning="track() p50 / EVALSHA p50 per round (time, lower is better)",
        setup=SETUP,
        target=TIME_TARGET,
        extra=extra,
    )
    subject_rates = [ops / wall for wall in subject_walls]
    base_rates = [ops / wall for wall in base_walls]
    rate_figure = Figure(
        key=f"{key}.throughput",
        title=f"track() {label} throughput vs EVALSHA",
        unit="ops/s",
        subject=Side(f"track() {label}", subject_rates, higher_is_better=True),
        baseline=Side(f"EVALSHA {label}", base_rates, higher_is_better=True),
        ratios=[s / b for s, b in zip(subject_rates, base_rates, strict=True)],
        ratio_meaning="track() ops/s / EVALSHA ops/s per round (higher is better); "
        "p99 = the rate 99 % of rounds beat",
        setup=SETUP,
        target=RATE_TARGET,
        extra={"tasks": tasks, "ops_per_round": ops},
    )
    return [time_figure, rate_figure]


def _timed(call: Callable[[], Any], ops: int) -> tuple[list[int], float]:
    pc = time.perf_counter_ns
    out = [0] * ops
    gc.collect()
    start = pc()
    for i in range(ops):
        t0 = pc()
        call()
        out[i] = pc() - t0
    return out, (pc() - start) / 1e9


def _sync(env: Env, client: redis.Redis, trivial: str) -> list[Figure]:
    ops = env.scale.track_ops
    bases: list[list[int]] = []
    subjects: list[list[int]] = []
    raws: list[list[int]] = []
    base_walls: list[float] = []
    subject_walls: list[float] = []
    with Outpost(redis=client, telemetry=False) as sdk:
        sdk.balance(METER, external_customer_id=CUSTOMER)  # follow the customer
        evalsha = client.evalsha

        def base() -> Any:
            return evalsha(trivial, 0)

        def subject() -> Any:
            return sdk.track("api_call", external_customer_id=CUSTOMER)

        _timed(base, ops // 10 + 1)  # warm-up: connections, script cache
        _timed(subject, ops // 10 + 1)
        for _ in range(env.scale.track_rounds):
            samples, wall = _timed(base, ops)
            bases.append(samples)
            base_walls.append(wall)
            samples, wall = _timed(subject, ops)
            subjects.append(samples)
            subject_walls.append(wall)
            raws.append(_timed(_raw_call(evalsha, ops), ops)[0])
    return _figures("sync", 1, bases, subjects, raws, base_walls, subject_walls, ops)


async def _timed_async(
    call: Callable[[], Awaitable[Any]], ops: int, tasks: int
) -> tuple[list[int], float]:
    pc = time.perf_counter_ns
    latencies: list[int] = []
    per_task = ops // tasks

    async def worker() -> None:
        for _ in range(per_task):
            t0 = pc()
            await call()
            latencies.append(pc() - t0)

    gc.collect()
    start = pc()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return latencies, (pc() - start) / 1e9


async def _async(env: Env, trivial: str, *, tasks: int, ops: int) -> list[Figure]:
    ops -= ops % tasks
    client = env.async_client()
    bases: list[list[int]] = []
    subjects: list[list[int]] = []
    raws: list[list[int]] = []
    base_walls: list[float] = []
    subject_walls: list[float] = []
    try:
        async with AsyncOutpost(redis=client, telemetry=False) as sdk:
            await sdk.balance(METER, external_customer_id=CUSTOMER)
            evalsha = client.evalsha

            async def base() -> Any:
                return await evalsha(trivial, 0)

            async def subject() -> Any:
                return await sdk.track("api_call", external_customer_id=CUSTOMER)

            warm = max(tasks, ops // 10)
            await _timed_async(base, warm, tasks)  # warm-up: opens the pool's connections
            await _timed_async(subject, warm, tasks)
            for _ in range(env.scale.track_rounds):
                samples, wall = await _timed_async(base, ops, tasks)
                bases.append(samples)
                base_walls.append(wall)
                samples, wall = await _timed_async(subject, ops, tasks)
                subjects.append(samples)
                subject_walls.append(wall)
                raw = _raw_call(evalsha, ops)
                raws.append((await _timed_async(raw, ops, tasks))[0])
    finally:
        await client.aclose()
    return _figures("async", tasks, bases, subjects, raws, base_walls, subject_walls, ops)
