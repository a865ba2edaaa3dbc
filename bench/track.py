"""``track()`` against a bare redis-py ``EVALSHA`` of its own track script, with the same KEYS and
ARGV, at the same concurrency (target: at most 1.15x its time, at least 0.8x its throughput): sync,
async at 1 and 64 tasks, with telemetry on as a user runs it (``track.*``) and off
(``track.*.telemetry_off``), each against its own baseline rounds; ``track.*.telemetry`` is the
cost of telemetry (on over off). ``track.script_redis`` is the track script's own Redis time
(``INFO commandstats``, µs per call, target: at most 40 µs for a one-meter event).

Each round runs, interleaved: ``EVALSHA return 1`` (JSON extra), the bare track script, and
``track()``."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import redis
import redis.asyncio

from bench._env import Env, configuration_of
from bench._offline import CONFIGURATION
from bench._stats import Figure, Side, Target, median, ns_to_us, round_ratio
from outpost_async import AsyncOutpost
from outpost_core import (
    SCRIPT_SHA1,
    SCRIPT_TEXT,
    ConfigurationReceived,
    RunScript,
    Session,
    Settings,
)
from outpost_sync import Outpost

CUSTOMER = "bench-track"
RAW_CUSTOMER = "bench-track-raw"
UNHEARD = "bench-baseline"
"""The channel namespace of the baseline's scripts: no instance subscribes to it."""
TRIVIAL = "return 1"
TIME_TARGET = Target(on="ratio", op="<=", value=1.15)
RATE_TARGET = Target(on="ratio", op=">=", value=0.8)
TELEMETRY_TARGET = Target(on="ratio", op="<=", value=1.05)
SCRIPT_TARGET = Target(on="p50", op="<=", value=40.0)
SETUP = (
    "The emulator (own process) is Polar: the instance has its access token, so it delivers "
    "the events it tracks and, telemetry on, exports telemetry through the emulator's relay, "
    "as a user runs it. The customer is warm (followed), as in an application that reads its "
    "balance. Baseline: EVALSHA of the track script on the client passed to the SDK as redis=, "
    "with KEYS and ARGV precomputed by outpost_core.Session for another customer (JSON encoding "
    "outside the timing) and the revision the caller holds, as the SDK passes it; it publishes "
    "its changes on channels that no subscriber of the instance hears."
)


def run(env: Env) -> list[Figure]:
    emu, _ = env.start(CUSTOMER, credits=1_000_000_000)
    configuration = configuration_of(emu)
    client = env.client()
    trivial = str(client.script_load(TRIVIAL))
    client.script_load(SCRIPT_TEXT["track"])  # the baseline calls it by its SHA1
    figures: list[Figure] = []
    for tasks, ops in ((0, env.scale.track_ops), (1, env.scale.track_ops)):
        figures += _both(env, client, configuration, trivial, tasks, ops)
    figures += _both(env, client, configuration, trivial, 64, env.scale.track_concurrent_ops)
    figures.append(_script_time(env, client, configuration, trivial))
    return figures


class _Sides:
    """The samples of one configuration's rounds: trivial EVALSHA, bare script, track()."""

    def __init__(self) -> None:
        self.trivial: list[list[int]] = []
        self.script: list[list[int]] = []
        self.subject: list[list[int]] = []
        self.script_walls: list[float] = []
        self.subject_walls: list[float] = []


def _both(
    env: Env,
    client: redis.Redis,
    configuration: dict[str, Any],
    trivial: str,
    tasks: int,
    ops: int,
) -> list[Figure]:
    """The figures of one concurrency (``tasks`` 0: the sync driver), telemetry on then off."""
    sides = {}
    for telemetry in (True, False):
        if tasks == 0:
            sides[telemetry] = _sync(env, client, configuration, trivial, ops, telemetry)
        else:
            sides[telemetry] = asyncio.run(
                _async(env, configuration, trivial, tasks, ops, telemetry)
            )
    mode = "sync" if tasks == 0 else "async"
    ops -= ops % max(tasks, 1)
    on = _figures(mode, max(tasks, 1), sides[True], ops, "")
    off = _figures(mode, max(tasks, 1), sides[False], ops, ".telemetry_off")
    return [*on, *off, _telemetry_figure(on[0], off[0])]


def _telemetry_figure(on: Figure, off: Figure) -> Figure:
    return Figure(
        key=on.key + ".telemetry",
        title=on.title.replace(" vs EVALSHA", "") + ": telemetry on vs off",
        unit="µs",
        subject=Side(on.subject.label + ", telemetry on", on.subject.samples),
        baseline=Side(off.subject.label + ", telemetry off", off.subject.samples),
        ratios=[on.ratio / off.ratio],
        ratio_meaning="(track() / bare script, telemetry on) / (the same, telemetry off): the "
        "share telemetry adds, each side against the baseline of its own rounds",
        setup=SETUP,
        target=TELEMETRY_TARGET,
    )


def _raw_runs(count: int, configuration: Any = CONFIGURATION) -> Iterator[RunScript]:
    """The track script's KEYS and ARGV as the core builds them, for fresh event ids, so that
    it can be run bare (the session follows no identity: the revision held is -1). Its changes
    are published on channels of their own (:data:`UNHEARD`): the instance measured beside it
    would otherwise read each of them, in this process, while the baseline runs."""
    session = Session(Settings(channel_namespace=UNHEARD))
    session.handle(ConfigurationReceived(configuration, from_cache=True))
    for _ in range(count):
        now = time.time_ns() // 1000
        yield session.track(
            name="api_call",
            external_customer_id=RAW_CUSTOMER,
            timestamp_us=now,
            now_us=now,
            event_id=uuid.uuid4().hex,
        )


def _raw_call(
    evalsha: Callable[..., Any], client: redis.Redis, configuration: Any, count: int
) -> Callable[[], Any]:
    """A call of the bare track script with the next precomputed KEYS and ARGV (sync or async,
    as ``evalsha`` is), each holding the revision the previous call made, as a caller that
    follows the customer passes it (the script then replies with the very delta it publishes)."""
    runs = [(r.keys, list(r.args)) for r in _raw_runs(count, configuration)]
    rev = int(client.hget(runs[0][0][1], "rev") or -1)
    for i, (_, args) in enumerate(runs):
        if rev >= 0:
            args[5] = str(rev + i)  # ARGV[6]: the revision held of the one identity
    calls = iter(runs)
    sha = SCRIPT_SHA1["track"]

    def call() -> Any:
        keys, args = next(calls)
        return evalsha(sha, len(keys), *keys, *args)

    return call


def _figures(mode: str, tasks: int, sides: _Sides, ops: int, suffix: str) -> list[Figure]:
    label = f"{mode}, {tasks} task{'s' if tasks > 1 else ''}" if mode == "async" else "sync"
    key = ("track.sync" if mode == "sync" else f"track.async.c{tasks}") + suffix
    telemetry = "telemetry off" if suffix else "telemetry on"
    extra = {
        "tasks": tasks,
        "ops_per_round": ops,
        "telemetry": not suffix,
        "trivial_evalsha_p50_us": median([x for r in sides.trivial for x in ns_to_us(r)]),
        "track_over_trivial_ratio": median(
            [round_ratio(s, b) for s, b in zip(sides.subject, sides.trivial, strict=True)]
        ),
        "script_over_trivial_ratio": median(
            [round_ratio(s, b) for s, b in zip(sides.script, sides.trivial, strict=True)]
        ),
        "trivial_note": "EVALSHA of `return 1` (0 keys) in the same rounds",
    }
    time_figure = Figure(
        key=key,
        title=f"track() {label}, {telemetry} vs EVALSHA track.lua",
        unit="µs",
        subject=Side(f"track() {label}", [x for r in sides.subject for x in ns_to_us(r)]),
        baseline=Side(f"EVALSHA track {label}", [x for r in sides.script for x in ns_to_us(r)]),
        ratios=[round_ratio(s, b) for s, b in zip(sides.subject, sides.script, strict=True)],
        ratio_meaning="track() p50 / bare track script p50 per round (time, lower is better)",
        setup=SETUP,
        target=TIME_TARGET if tasks == 1 else None,
        extra=extra,
    )
    subject_rates = [ops / wall for wall in sides.subject_walls]
    base_rates = [ops / wall for wall in sides.script_walls]
    rate_figure = Figure(
        key=f"{key}.throughput" if not suffix else key.replace(suffix, ".throughput" + suffix),
        title=f"track() {label}, {telemetry} throughput vs EVALSHA track.lua",
        unit="ops/s",
        subject=Side(f"track() {label}", subject_rates, higher_is_better=True),
        baseline=Side(f"EVALSHA track {label}", base_rates, higher_is_better=True),
        ratios=[s / b for s, b in zip(subject_rates, base_rates, strict=True)],
        ratio_meaning="track() ops/s / bare track script ops/s per round (higher is better); "
        "p99 = the rate 99 % of rounds beat",
        setup=SETUP,
        target=RATE_TARGET,
        extra={"tasks": tasks, "ops_per_round": ops, "telemetry": not suffix},
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


def _sync(
    env: Env,
    client: redis.Redis,
    configuration: dict[str, Any],
    trivial: str,
    ops: int,
    telemetry: bool,
) -> _Sides:
    sides = _Sides()
    emu = env.emulator
    with Outpost(
        access_token=emu.token, server_url=emu.url, redis=client, telemetry=telemetry
    ) as sdk:
        sdk.balance(env.meter, external_customer_id=CUSTOMER)  # follow the customer
        evalsha = client.evalsha

        def base() -> Any:
            return evalsha(trivial, 0)

        def subject() -> Any:
            return sdk.track("api_call", external_customer_id=CUSTOMER)

        _timed(base, ops // 10 + 1)  # warm-up: connections, script cache
        _timed(_raw_call(evalsha, client, configuration, ops // 10 + 1), ops // 10 + 1)
        _timed(subject, ops // 10 + 1)
        for _ in range(env.scale.track_rounds):
            sides.trivial.append(_timed(base, ops)[0])
            samples, wall = _timed(_raw_call(evalsha, client, configuration, ops), ops)
            sides.script.append(samples)
            sides.script_walls.append(wall)
            samples, wall = _timed(subject, ops)
            sides.subject.append(samples)
            sides.subject_walls.append(wall)
    return sides


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


async def _async(
    env: Env,
    configuration: dict[str, Any],
    trivial: str,
    tasks: int,
    ops: int,
    telemetry: bool,
) -> _Sides:
    ops -= ops % tasks
    client = env.async_client()
    reader = env.client()  # the revision held before a round (outside the timing)
    sides = _Sides()
    emu = env.emulator
    try:
        async with AsyncOutpost(
            access_token=emu.token, server_url=emu.url, redis=client, telemetry=telemetry
        ) as sdk:
            await sdk.balance(env.meter, external_customer_id=CUSTOMER)
            evalsha = client.evalsha

            async def base() -> Any:
                return await evalsha(trivial, 0)

            async def subject() -> Any:
                return await sdk.track("api_call", external_customer_id=CUSTOMER)

            warm = max(tasks, ops // 10)
            await _timed_async(base, warm, tasks)  # warm-up: opens the pool's connections
            await _timed_async(_raw_call(evalsha, reader, configuration, warm), warm, tasks)
            await _timed_async(subject, warm, tasks)
            for _ in range(env.scale.track_rounds):
                sides.trivial.append((await _timed_async(base, ops, tasks))[0])
                raw = _raw_call(evalsha, reader, configuration, ops)
                samples, wall = await _timed_async(raw, ops, tasks)
                sides.script.append(samples)
                sides.script_walls.append(wall)
                samples, wall = await _timed_async(subject, ops, tasks)
                sides.subject.append(samples)
                sides.subject_walls.append(wall)
    finally:
        await client.aclose()
    return sides


def _server_us(client: redis.Redis) -> float:
    stats: dict[str, Any] = client.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec_per_call", 0.0))


def _script_time(
    env: Env, client: redis.Redis, configuration: dict[str, Any], trivial: str
) -> Figure:
    """Redis's own time for the track script of a one-meter event, against ``return 1``, with
    an instance subscribed (so the script publishes to a subscriber, as in production) that
    tracks nothing itself (no access token: it runs no script of its own)."""
    ops = env.scale.track_ops
    scripts: list[float] = []
    trivials: list[float] = []
    with Outpost(redis=client, telemetry=False):
        for _ in range(env.scale.track_rounds):
            client.config_resetstat()
            _timed(lambda: client.evalsha(trivial, 0), ops)
            trivials.append(_server_us(client))
            client.config_resetstat()
            _timed(_raw_call(client.evalsha, client, configuration, ops), ops)
            scripts.append(_server_us(client))
    return Figure(
        key="track.script_redis",
        title="track script's Redis time (INFO commandstats) vs return 1",
        unit="µs",
        subject=Side("track.lua, one meter", scripts),
        baseline=Side("return 1", trivials),
        ratios=[s / t if t else float("nan") for s, t in zip(scripts, trivials, strict=True)],
        ratio_meaning="usec_per_call of the track script / of `return 1`, per round",
        setup="Redis's own time per EVALSHA (commandstats reset before each side of a round); "
        "one subscribed instance, as in production",
        target=SCRIPT_TARGET,
        extra={"ops_per_round": ops},
    )
