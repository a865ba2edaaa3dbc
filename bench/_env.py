"""What every benchmark shares: its Redis, emulators, client settings, scale, and the machine."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import importlib.metadata
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis
import redis.asyncio

from bench._emulator import EmulatorProcess
from outpost_emulator.redis_server import RedisServer

CALLS_FILTER: dict[str, Any] = {
    "conjunction": "and",
    "clauses": [{"property": "name", "operator": "eq", "value": "api_call"}],
}
HEALTH_CHECK_INTERVAL = 10  # what outpost_*._backend.own_client gives the SDK's own client


@dataclass(frozen=True)
class Scale:
    """How much each benchmark does. ``SMOKE`` only proves that every figure still comes out."""

    name: str
    balance_rounds: int
    balance_ops: int  # warm balance() calls per round
    get_ops: int  # GETs per round
    track_rounds: int
    track_ops: int  # per round and side, sync and async at one task
    track_concurrent_ops: int  # per round and side, all tasks together
    lag_rounds: int
    lag_samples: int  # per round and side
    lag_first_touch: int  # first-touch samples per round (a fresh customer each)
    lag_new_instance: int  # per round, a new reading instance (and customer) each
    load_rounds: int
    load_seconds: float  # how long both instances track flat out, per round
    fresh_rounds: int
    fresh_ops: int  # per round and side
    memory_rounds: int
    memory_customers: int  # customers warmed per round
    identity_rounds: int
    identity_events: int  # events of one identity-hour
    delivery_rounds: int
    delivery_events: int  # per round and side
    snapshot_rounds: int
    snapshot_applies: int  # per round and number of pending events
    snapshot_pending: tuple[int, ...]
    snapshot_hot: tuple[int, ...]  # hot pending events beside one bucket made cold
    failover_rounds: int
    failover_events: int  # tracked by the process that gets killed
    fleet_processes: int
    fleet_seconds: float  # each process tracks this long


FULL = Scale(
    name="full",
    balance_rounds=21,
    balance_ops=20_000,
    get_ops=2_000,
    track_rounds=15,
    track_ops=2_000,
    track_concurrent_ops=3_200,
    lag_rounds=10,
    lag_samples=250,
    lag_first_touch=20,
    lag_new_instance=2,
    load_rounds=5,
    load_seconds=3.0,
    fresh_rounds=11,
    fresh_ops=2_000,
    memory_rounds=5,
    memory_customers=200,
    identity_rounds=3,
    identity_events=3_600,
    delivery_rounds=5,
    delivery_events=10_000,
    snapshot_rounds=11,
    snapshot_applies=20,
    snapshot_pending=(1, 100, 10_000),
    snapshot_hot=(10, 10_000),
    failover_rounds=3,
    failover_events=500,
    fleet_processes=8,
    fleet_seconds=60.0,
)

SMOKE = Scale(
    name="smoke",
    balance_rounds=3,
    balance_ops=500,
    get_ops=100,
    track_rounds=2,
    track_ops=50,
    track_concurrent_ops=128,
    lag_rounds=2,
    lag_samples=10,
    lag_first_touch=2,
    lag_new_instance=1,
    load_rounds=1,
    load_seconds=0.3,
    fresh_rounds=2,
    fresh_ops=50,
    memory_rounds=2,
    memory_customers=10,
    identity_rounds=1,
    identity_events=60,
    delivery_rounds=2,
    delivery_events=200,
    snapshot_rounds=2,
    snapshot_applies=2,
    snapshot_pending=(1, 100, 10_000),
    snapshot_hot=(10, 10_000),
    failover_rounds=1,
    failover_events=20,
    fleet_processes=2,
    fleet_seconds=2.0,
)


class Env:
    """One redis-server for the whole run; emulators on demand; clients with the SDK's settings.

    Benchmarks run one after the other and each starts from an empty Redis (``reset``).
    """

    def __init__(self, scale: Scale) -> None:
        self.scale = scale
        self.redis = RedisServer()
        self._clients: list[redis.Redis] = []
        self._emulator: EmulatorProcess | None = None
        self._meter: str | None = None

    def __enter__(self) -> Env:
        self.redis.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for client in self._clients:
            client.close()
        if self._emulator is not None:
            self._emulator.close()
        self.redis.close()

    @property
    def url(self) -> str:
        return self.redis.url

    def client(self) -> redis.Redis:
        """A client built as the SDK builds its own (``Redis.from_url``), closed with the env.
        hiredis parses its replies when it is installed, for the SDK and the baselines alike."""
        client = redis.Redis.from_url(self.url, health_check_interval=HEALTH_CHECK_INTERVAL)
        self._clients.append(client)
        return client

    def async_client(self) -> redis.asyncio.Redis:
        """The asyncio twin of :meth:`client`; the caller closes it (``aclose``) in its loop."""
        return redis.asyncio.Redis.from_url(self.url, health_check_interval=HEALTH_CHECK_INTERVAL)

    def reset(self) -> None:
        admin = redis.Redis(port=self.redis.port)
        try:
            admin.flushall()
            admin.config_resetstat()
        finally:
            admin.close()
        gc.collect()

    def start(self, *customers: str, credits: int = 0) -> tuple[EmulatorProcess, str]:
        """A benchmark's start: an empty Redis (:meth:`reset`), the emulator and its meter, with
        ``credits`` granted on that meter to each of ``customers``."""
        self.reset()
        emu, meter = self.emulator, self.meter
        for customer in customers:
            emu.grant_credits(meter, credits, external_customer_id=customer)
        return emu, meter

    @property
    def emulator(self) -> EmulatorProcess:
        """The run's local Polar, in its own process, started on first use; its clock runs from
        now. Benchmarks share it (and its one count meter, :attr:`meter`): each uses its own
        customers, and leaves its clock running and its syncs on."""
        if self._emulator is None:
            self._emulator = EmulatorProcess(sync_delay=1.0)
            self._meter = self._emulator.create_meter("calls", CALLS_FILTER, {"func": "count"})
        return self._emulator

    @property
    def meter(self) -> str:
        """The id of the emulator's count meter (events named ``api_call``)."""
        if self._meter is None:
            _ = self.emulator
        assert self._meter is not None
        return self._meter


def configuration_of(emu: EmulatorProcess) -> dict[str, Any]:
    """The configuration payload Polar (here the emulator) sends, as the SDK caches it."""
    state: dict[str, Any] = emu.state()
    return {
        "organization_id": state["organization_id"],
        "meters": state["meters"],
        "reducers": state["reducers"],
    }


def reducer_of(emu: EmulatorProcess, meter: str) -> str:
    """The id of the reducer that serves ``meter`` (it names the meter's state hash in Redis)."""
    for reducer in configuration_of(emu)["reducers"]:
        if meter in reducer["meter_ids"]:
            return str(reducer["id"])
    raise RuntimeError(f"no reducer serves meter {meter}")


def timer_overhead_ns() -> float:
    """The median cost of one ``perf_counter_ns()`` pair, included in every per-call latency."""
    pc = time.perf_counter_ns
    samples = []
    for _ in range(20_000):
        t0 = pc()
        samples.append(pc() - t0)
    samples.sort()
    return float(samples[len(samples) // 2])


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine(env: Env) -> dict[str, Any]:
    admin = redis.Redis(port=env.redis.port)
    try:
        server: dict[str, Any] = admin.info("server")
    finally:
        admin.close()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "redis_server": str(server.get("redis_version")),
        "redis_py": _version("redis"),
        "hiredis": _version("hiredis"),
        "httpx": _version("httpx"),
        "asyncio_loop": "asyncio (default policy)",
        "timer_overhead_ns": timer_overhead_ns(),
        "telemetry_env": os.environ.get("POLAR_OUTPOST_TELEMETRY", "1"),
        "load_average_at_start": list(load) if load else None,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "scale": asdict(env.scale),
    }
