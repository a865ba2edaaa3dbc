"""Delivery throughput: events per second from the outbox to the emulator, against the
emulator's raw ingest rate (the same events, posted bare in batches of the same size).

Twice: against the emulator as it answers on this machine, whose cores it shares with Redis and
the SDK (the SDK's work per batch then competes with Polar's own), and against the emulator
answering each ingest request :data:`DISTANT` seconds late, as Polar does across a network
(the SDK's work per batch then overlaps the wait for the previous post).

Each round queues fresh events in the outbox (the track script, pipelined, as ``track()`` would
write them: one identity update and one outbox entry each, over many customers), then times an
instance with an access token from its start until ``flush()`` returns (every event posted,
acknowledged and removed from the outbox).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

from bench._env import Env, configuration_of
from bench._stats import Figure, Side, Target
from outpost_async import AsyncOutpost
from outpost_core import (
    SCRIPT_SHA1,
    SCRIPT_TEXT,
    ConfigurationReceived,
    RunScript,
    Session,
    keys,
)
from outpost_sync import Outpost

CUSTOMERS = 100
DISTANT = 0.02  # seconds each ingest request waits in the "Polar across a network" rounds
TARGET = Target(on="ratio", op=">=", value=0.8)
BATCH = 500  # the SDK's default batch_size
SETUP = (
    "Per round, {e} fresh events over {c} customers are queued in the outbox (the track script, "
    "pipelined); an instance with a token then delivers them with its defaults (batch_size "
    "{b}, one request in flight); time = from the call to flush() (the instance starts there) "
    "until it returns. Baseline: the same kind of events posted bare with the driver's HTTP "
    "client (httpx.Client, httpx.AsyncClient; keep-alive), {b} per request, one after the "
    "other. The emulator runs in its own process. The shared request budget starts each round "
    "full (rounds come seconds apart: each would start with what the previous one left)."
)


def _runs(configuration: dict[str, Any], tag: str, count: int) -> list[RunScript]:
    session = Session()
    session.handle(ConfigurationReceived(configuration, from_cache=True))
    now = time.time_ns() // 1000
    return [
        session.track(
            name="api_call",
            external_customer_id=f"bench-dl-{tag}-{n % CUSTOMERS}",
            timestamp_us=now,
            now_us=now,
            event_id=uuid.uuid4().hex,
        )
        for n in range(count)
    ]


def _queue(client: redis.Redis, runs: list[RunScript]) -> None:
    sha = SCRIPT_SHA1["track"]
    for start in range(0, len(runs), 1000):
        pipe = client.pipeline(transaction=False)
        for run in runs[start : start + 1000]:
            pipe.evalsha(sha, len(run.keys), *run.keys, *run.args)
        pipe.execute()


def _bodies(runs: list[RunScript]) -> list[bytes]:
    items = [str(run.args[3]).encode() for run in runs]
    return [
        b'{"events":[' + b",".join(items[i : i + BATCH]) + b"]}"
        for i in range(0, len(items), BATCH)
    ]


def _check(response: httpx.Response) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"raw ingest answered {response.status_code}: {response.text}")


def _raw(env: Env, http: httpx.Client, runs: list[RunScript], cpu: CpuMeter) -> float:
    """Events per second of bare ingest requests, with the sync driver's client."""
    bodies = _bodies(runs)
    cpu.start()
    start = time.perf_counter()
    for body in bodies:
        _check(http.post("/v1/events/ingest", content=body))
    return len(runs) / cpu.stop(len(runs), time.perf_counter() - start)


async def _raw_async(env: Env, runs: list[RunScript], cpu: CpuMeter) -> float:
    """The same with the async driver's client (httpx's AsyncClient costs more per request)."""
    bodies = _bodies(runs)
    async with httpx.AsyncClient(
        base_url=env.emulator.url, headers=_headers(env), timeout=_TIMEOUT
    ) as http:
        cpu.start()
        start = time.perf_counter()
        for body in bodies:
            _check(await http.post("/v1/events/ingest", content=body))
        return len(runs) / cpu.stop(len(runs), time.perf_counter() - start)


_TIMEOUT = httpx.Timeout(30.0, connect=5.0)


def _headers(env: Env) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {env.emulator.token}",
        "User-Agent": "outpost-bench",
        "Content-Type": "application/json",
    }


def _options(env: Env) -> dict[str, Any]:
    emu = env.emulator
    return dict(access_token=emu.token, server_url=emu.url, redis_url=env.url, telemetry=False)


class CpuMeter:
    """CPU milliseconds per 1,000 events that the emulator, redis-server and this process used
    meanwhile: where a side's time goes on a machine whose cores all three share."""

    def __init__(self, env: Env, client: redis.Redis) -> None:
        self._emulator, self._client = env.emulator, client
        self.totals: dict[str, float] = {"emulator": 0.0, "redis": 0.0, "sdk": 0.0}
        self.events = 0
        self._before: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        cpu = self._client.info("cpu")
        emulator = self._emulator.cpu_seconds()
        return {
            "emulator": emulator if emulator is not None else float("nan"),
            "redis": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            "sdk": time.process_time(),
        }

    def start(self) -> None:
        self._before = self._now()

    def stop(self, events: int, elapsed: float) -> float:
        """Count what was used since :meth:`start` for ``events``; returns ``elapsed``."""
        after = self._now()
        for side in self.totals:
            self.totals[side] += after[side] - self._before[side]
        self.events += events
        return elapsed

    def per_thousand(self) -> dict[str, float]:
        return {k: round(v * 1e6 / self.events, 1) for k, v in self.totals.items()}


def _sync(env: Env, count: int, cpu: CpuMeter) -> float:
    sdk = Outpost(**_options(env))
    try:
        cpu.start()
        start = time.perf_counter()
        if not sdk.flush(300):
            raise RuntimeError("the outbox was not delivered within 300 s")
        return count / cpu.stop(count, time.perf_counter() - start)
    finally:
        sdk.close()


async def _async(env: Env, count: int, cpu: CpuMeter) -> float:
    sdk = AsyncOutpost(**_options(env))
    try:
        cpu.start()
        start = time.perf_counter()
        if not await sdk.flush(300):
            raise RuntimeError("the outbox was not delivered within 300 s")
        return count / cpu.stop(count, time.perf_counter() - start)
    finally:
        await sdk.close()


@dataclass
class _Sides:
    """Per round: events/s of the bare posts and of delivery, per driver; CPU per side."""

    raw: list[float] = field(default_factory=list)
    sync: list[float] = field(default_factory=list)
    raw_async: list[float] = field(default_factory=list)
    asynchronous: list[float] = field(default_factory=list)
    cpu: dict[str, CpuMeter] = field(default_factory=dict)


def _rounds(env: Env, configuration: dict[str, Any], tag: str, rounds: int) -> _Sides:
    client = env.client()
    events = env.scale.delivery_events
    sides = _Sides(
        cpu={side: CpuMeter(env, client) for side in ("raw", "sync", "raw_async", "async")}
    )
    cpu = sides.cpu
    with httpx.Client(base_url=env.emulator.url, headers=_headers(env), timeout=_TIMEOUT) as http:
        for r in range(rounds):
            bare = _runs(configuration, f"{tag}raw{r}", events)
            sides.raw.append(_raw(env, http, bare, cpu["raw"]))
            _queue(client, _runs(configuration, f"{tag}sync{r}", events))
            client.delete(keys.BUDGET_KEY)
            sides.sync.append(_sync(env, events, cpu["sync"]))
            bare = _runs(configuration, f"{tag}ra{r}", events)
            sides.raw_async.append(asyncio.run(_raw_async(env, bare, cpu["raw_async"])))
            _queue(client, _runs(configuration, f"{tag}async{r}", events))
            client.delete(keys.BUDGET_KEY)
            sides.asynchronous.append(asyncio.run(_async(env, events, cpu["async"])))
    return sides


def run(env: Env) -> list[Figure]:
    env.reset()
    scale = env.scale
    emu = env.emulator
    configuration = configuration_of(emu)
    env.client().script_load(SCRIPT_TEXT["track"])
    near = _rounds(env, configuration, "", scale.delivery_rounds)
    # Every ingest request (bare or the SDK's) waits DISTANT seconds before the emulator reads
    # it: the emulator's fault, with a count no round reaches, cleared afterwards.
    emu.set_faults({"ingest_hang": {"seconds": DISTANT, "count": 1_000_000}})
    try:
        far = _rounds(env, configuration, "far", max(2, scale.delivery_rounds - 2))
    finally:
        emu.set_faults({"clear": True})
    return _figures(env, near, "") + _figures(env, far, f".polar_{round(DISTANT * 1000)}ms")


def _figures(env: Env, sides: _Sides, suffix: str) -> list[Figure]:
    events = env.scale.delivery_events
    cpu = sides.cpu
    setup = SETUP.format(e=events, c=CUSTOMERS, b=BATCH)
    if suffix:
        setup += (
            f" Here every ingest request, bare or the SDK's, waits {DISTANT * 1000:.0f} ms in the "
            "emulator before it is read (as if Polar answered across a network)."
        )
    extra = {
        "events_per_round": events,
        "customers": CUSTOMERS,
        "batch_size": BATCH,
        "cpu_ms_per_1000_events": {side: meter.per_thousand() for side, meter in cpu.items()},
    }
    where = f", Polar {DISTANT * 1000:.0f} ms away" if suffix else ""
    return [
        Figure(
            key=f"delivery.{driver}{suffix}",
            title=f"delivery outbox → emulator{where}, {driver}",
            unit="events/s",
            subject=Side(f"delivery {driver}", rates, higher_is_better=True),
            baseline=Side(f"raw ingest ({client_name}, sequential)", bare, higher_is_better=True),
            ratios=[s / b for s, b in zip(rates, bare, strict=True)],
            ratio_meaning="delivery events/s / raw ingest events/s per round (higher is better); "
            "p50/p99 over rounds, p99 = the rate 99 % of rounds beat",
            setup=setup,
            extra=extra,
            target=TARGET,
        )
        for driver, rates, bare, client_name in (
            ("sync", sides.sync, sides.raw, "httpx.Client"),
            ("async", sides.asynchronous, sides.raw_async, "httpx.AsyncClient"),
        )
    ]
