"""Helpers for the driver tests, written once (async) and generated for the sync driver."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from outpost_async import AsyncOutpost
from outpost_async._backend import sleep
from outpost_emulator import Emulator
from tests.support import polar
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_server import RedisServer
from tests.support.wiring import shards_of, wired

COUNT = "m-count"
TOKENS = "m-tokens"
LARGEST = "m-largest"
UNIQUE = "m-unique"
CONFIGURATION = polar.configuration(
    polar.reducer("r-count", [COUNT], clauses=[
        {"property": "name", "operator": "eq", "value": "api_call"},
    ]),
    polar.reducer("r-tokens", [TOKENS], func="sum", prop="tokens"),
    polar.reducer("r-largest", [LARGEST], func="max", prop="tokens"),
    polar.reducer("r-unique", [UNIQUE], func="unique", prop="user"),
)  # fmt: skip


def now_us() -> int:
    return time.time_ns() // 1000


def make(server: RedisServer | RedisCluster, **options: Any) -> AsyncOutpost:
    options.setdefault("snapshot_timeout", 5.0)
    options.setdefault("telemetry", False)
    options.setdefault("shards", shards_of(server))
    return AsyncOutpost(redis_url=server.url, **options)


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Wait until ``check`` holds, looking again every few milliseconds, up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        await sleep(0.005)


def holds(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """A check for ``eventually`` made of a condition that reads no I/O (an attribute, a count)."""

    async def check() -> bool:
        return condition()

    return check


@pytest.fixture
def on_redis_and_cluster(redis_or_cluster: RedisServer) -> RedisServer:
    """A suite that runs on one Redis and on a cluster (which has the same ``url`` and
    ``client()``) takes this as its ``redis_server``: ``redis_server = on_redis_and_cluster``."""
    return redis_or_cluster


async def credited(instance: AsyncOutpost, meter: str, customer: str) -> float:
    return (await instance.balance(meter, external_customer_id=customer)).credited


async def until_credited(
    meter: str,
    customer: str,
    expected: float,
    *instances: AsyncOutpost,
    what: str,
    timeout: float = 10.0,
) -> None:
    """Wait until every instance reads ``expected`` credits for the customer (a snapshot came)."""

    async def reached() -> bool:
        readings = [await credited(instance, meter, customer) for instance in instances]
        return all(reading == expected for reading in readings)

    await eventually(reached, timeout=timeout, what=what)


def connect(server: RedisServer | RedisCluster, emulator: Emulator, **options: Any) -> AsyncOutpost:
    """An instance wired to the emulator (its clock too) and to a test Redis, that waits 5 s for a
    snapshot and retries from 50 ms."""
    defaults = wired(server, emulator, snapshot_timeout=5.0, retry_base=0.05)
    return AsyncOutpost(**(defaults | options))


CALLS_FILTER = {
    "conjunction": "and",
    "clauses": [{"property": "name", "operator": "eq", "value": "api_call"}],
}


def count_meter(emulator: Emulator, *, credits: int = 0, customer: str = "c1") -> str:
    """A meter counting ``api_call`` events; ``credits`` (if any) granted on it to ``customer``."""
    meter: dict[str, Any] = emulator.create_meter("calls", CALLS_FILTER, {"func": "count"})
    return _granted(emulator, str(meter["id"]), credits, customer)


def sum_meter(emulator: Emulator, *, credits: int = 0, customer: str = "c1") -> str:
    """A meter summing the ``tokens`` of ``api_call`` events; ``credits`` as ``count_meter``."""
    meter: dict[str, Any] = emulator.create_meter(
        "tokens", CALLS_FILTER, {"func": "sum", "property": "tokens"}
    )
    return _granted(emulator, str(meter["id"]), credits, customer)


def _granted(emulator: Emulator, meter: str, credits: int, customer: str) -> str:
    if credits:
        emulator.grant_credits(meter, credits, external_customer_id=customer)
    return meter


@asynccontextmanager
async def metered(
    server: RedisServer | RedisCluster,
    emulator: Emulator,
    *,
    credits: int = 0,
    customer: str = "c1",
    kind: Callable[..., str] = count_meter,
    warm: bool = False,
    **options: Any,
) -> AsyncIterator[tuple[str, AsyncOutpost]]:
    """A meter of ``kind`` (``count_meter`` or ``sum_meter``) with ``credits`` granted to
    ``customer``, then an instance ``connect`` opens with ``options``: yields both. ``warm``: the
    instance has read the customer first and seen the credits (its first snapshot applied)."""
    meter = kind(emulator, credits=credits, customer=customer)
    async with connect(server, emulator, **options) as instance:
        if warm:
            assert await credited(instance, meter, customer) == credits
        yield meter, instance
