"""The lag from ``track()`` returning on one instance to a read on another seeing it (D10: p99
within 2 ms on loopback), sync and async, against one redis-py ``GET`` round trip (the ratio says
how many round trips the propagation takes); the JSON also gives the same lag without Outpost (a
redis-py write in one process seen by another polling Redis with ``GET``).

The two instances live in two processes, as two instances of an application would: the tracking
one in a child process (``bench._tracker``), the reading one here. A sample: note the reader's
``consumed``, arm a poller that reads its warm ``balance()`` until that moves, have the child
``track()`` one event and report the moment its call returned (``perf_counter_ns``:
CLOCK_MONOTONIC, common to both processes). The lag is the poller's first sight minus that moment.
The no-Outpost samples are taken the same way: the child ``INCR``s a key, a poller here ``GET``s
it until it moves (each look is then a round trip to Redis, where the SDK's is a memory read).

First touch (``lag.*.first_touch``, issue 20): the same lag, but each sample uses a customer the
reader has never read: its first ``balance()`` returns, then the child tracks for that customer at
once, then the poller reads it until it moves. New instance (``lag.*.new_instance``): the same
with a reading instance started for the sample (its very first read, issue 20's reproduction),
closed after. Baseline of both: the warm-customer lag of the same rounds.
The JSON says where the reads were answered from (``Balance.source``: memory, or Redis when the copy
was not following Redis yet).

Every instance runs with telemetry on, as a user runs it; ``POLAR_OUTPOST_TELEMETRY=0 python -m
bench --only lag`` gives the same rows with it off (the child inherits the variable).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench._child import ChildProcess
from bench._emulator import EmulatorProcess
from bench._env import Env
from bench._stats import Figure, Side, Target, percentile, round_ratio
from outpost_async import AsyncOutpost
from outpost_sync import Outpost

ROOT = Path(__file__).resolve().parents[1]
CUSTOMER = "bench-lag"
COUNTER = "bench:lag:counter"
TIMEOUT_S = 2.0
TARGET = Target(on="p99", op="<=", value=1500.0)  # D16 (D10 said 2 ms)
SETUP = (
    "Two instances, each in its own process with its own Redis client, both connected to the "
    "emulator (deliveries and acknowledgements run as in production), both warm; the tracking "
    "one in a child process. The reader's balance() is polled by a {poller} that yields between "
    "reads (time.sleep(0) / asyncio.sleep(0)). Samples are 0.5-1.5 ms apart. Baseline: one "
    "redis-py GET round trip from the reader's process, in the same rounds; extra: the same "
    "lag without Outpost (INCR in the child, GET polled here)."
)


def run(env: Env) -> list[Figure]:
    env.reset()
    emu, meter = env.emulator, env.meter
    emu.grant_credits(meter, 1_000_000_000, external_customer_id=CUSTOMER)
    sync = _sync(env, emu, meter)
    asynchronous = asyncio.run(_async(env, emu, meter))
    return [*sync, *asynchronous]


class _Followed:
    """Which customer the poller reads, and where the reads were answered from."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.customer = CUSTOMER
        self.last_source = ""
        self.polls: Counter[str] = Counter()  # every read of the poller, by source
        self.first: Counter[str] = Counter()  # a fresh customer's first read, by source
        self.seeing: Counter[str] = Counter()  # the read that first saw the event, by source

    def saw(self, source: str) -> None:
        self.last_source = source
        if self.customer != CUSTOMER:  # only the first-touch customers' reads are reported
            self.polls[source] += 1

    def fresh_customer(self, driver: str) -> str:
        self.customer = f"{CUSTOMER}-{self.kind}-{driver}-{sum(self.first.values())}"
        return self.customer


KINDS = {
    "first_touch": ("first-touch", "a customer the reader never read"),
    "new_instance": ("new-instance", "a new reading instance's first customer"),
}


def _first_touch_figure(
    driver: str,
    warm: list[list[float]],
    firsts: list[list[float]],
    trips: list[list[float]],
    timeouts: int,
    followed: _Followed,
    how: str,
) -> Figure:
    every = [x for r in trips for x in r]
    polls = sum(followed.polls.values())
    label, what = KINDS[followed.kind]
    return Figure(
        key=f"lag.{driver}.{followed.kind}",
        title=f"track() in one process → balance() of {what} in another, {driver}",
        unit="µs",
        subject=Side(f"{label} lag {driver}", [x for r in firsts for x in r]),
        baseline=Side(f"warm-customer lag {driver}", [x for r in warm for x in r]),
        ratios=[round_ratio(s, b) for s, b in zip(firsts, warm, strict=True)],
        ratio_meaning=f"{label} lag p50 / warm-customer lag p50 per round",
        setup=how,
        target=TARGET,
        extra={
            "customers": sum(followed.first.values()),
            "timeouts": timeouts,
            "timeout_s": TIMEOUT_S,
            "first_read_from_redis": followed.first["redis"],
            "first_read_from_memory": followed.first["memory"],
            "seeing_read_from_redis": followed.seeing["redis"],
            "seeing_read_from_memory": followed.seeing["memory"],
            "poll_reads": polls,
            "poll_reads_from_redis_fraction": followed.polls["redis"] / polls if polls else 0.0,
            "get_round_trip_p50_us": percentile(every, 50),
            "source_note": "first_read: the customer's first balance() on the reader, before the "
            "track; seeing_read: the poll that first saw the event; poll_reads: every read of "
            f"the poller for {label} customers",
        },
    )


def _figure(
    driver: str,
    polls: list[list[float]],
    trips: list[list[float]],
    subjects: list[list[float]],
    timeouts: int,
    how: str,
) -> Figure:
    polled = [x for r in polls for x in r]
    return Figure(
        key=f"lag.{driver}",
        title=f"track() in one process → balance() in another, {driver}",
        unit="µs",
        subject=Side(f"cross-instance lag {driver}", [x for r in subjects for x in r]),
        baseline=Side(f"GET round trip {driver}", [x for r in trips for x in r]),
        ratios=[round_ratio(s, b) for s, b in zip(subjects, trips, strict=True)],
        ratio_meaning="lag p50 / GET round-trip p50 per round (how many round trips it takes)",
        setup=how,
        target=TARGET,
        extra={
            "timeouts": timeouts,
            "timeout_s": TIMEOUT_S,
            "incr_get_poll_p50_us": percentile(polled, 50),
            "incr_get_poll_p99_us": percentile(polled, 99),
            "incr_get_poll_note": "without Outpost: INCR in the child, GET polled here until it "
            "moves, taken like the lag (it can be negative: the poll's GET may see the write "
            "before the writer's own call has returned)",
        },
    )


def _gap() -> float:
    return random.uniform(0.0005, 0.0015)


def _arguments(driver: str, env: Env, emu: EmulatorProcess, meter: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench._tracker",
        driver,
        env.url,
        emu.url,
        emu.token,
        meter,
        CUSTOMER,
        COUNTER,
    ]


def _lag_us(returned: int, seen: int | None) -> tuple[float, bool]:
    """The lag, and whether it timed out (then counted as the timeout)."""
    if seen is None:
        return TIMEOUT_S * 1e6, True
    return (seen - returned) / 1000.0, False


# -- sync ------------------------------------------------------------------------------------


class _Child(ChildProcess):
    """A tracking process (``_tracker``): ``ask`` returns when it says its command returned."""

    def __init__(self, arguments: list[str]) -> None:
        super().__init__(arguments)
        self.ready()

    def ask(self, command: str) -> int:
        self.send(command)
        return int(self.line())


class _Watch:
    """A thread that, once armed, reads until the value moves and notes when it saw it."""

    def __init__(self, read: Callable[[], Any]) -> None:
        self._read = read
        self.before: Any = None
        self.seen_at: int | None = None
        self._armed = threading.Event()
        self._seen = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="bench-lag-poller", daemon=True)
        self._thread.start()

    def arm(self, before: Any) -> None:
        self.before, self.seen_at = before, None
        self._seen.clear()
        self._armed.set()

    def wait(self) -> int | None:
        self._seen.wait(TIMEOUT_S + 1)
        return self.seen_at

    def close(self) -> None:
        self._closed = True
        self._armed.set()
        self._thread.join(5)

    def _loop(self) -> None:
        pc = time.perf_counter_ns
        while True:
            self._armed.wait()
            self._armed.clear()
            if self._closed:
                return
            before, deadline = self.before, pc() + int(TIMEOUT_S * 1e9)
            while True:
                if self._read() != before:
                    self.seen_at = pc()
                    break
                if pc() > deadline:
                    break
                time.sleep(0)  # hand the GIL over: the subscriber thread must run
            self._seen.set()


def _round_trips(call: Callable[[], Any], count: int) -> list[float]:
    pc = time.perf_counter_ns
    out = []
    for _ in range(count):
        t0 = pc()
        call()
        out.append((pc() - t0) / 1000.0)
    return out


def _newcomer_sync(
    env: Env, emu: EmulatorProcess, meter: str, child: _Child, newcomers: _Followed
) -> tuple[float, bool]:
    """A new instance's first read of a new customer, then the child's track, then its reads."""
    name = newcomers.fresh_customer("sync")
    with Outpost(
        access_token=emu.token, server_url=emu.url, redis_url=env.url, telemetry=True
    ) as newcomer:
        first = newcomer.balance(meter, external_customer_id=name)
        newcomers.first[first.source] += 1

        def consumed() -> float:
            found = newcomer.balance(meter, external_customer_id=name)
            newcomers.saw(found.source)
            return found.consumed

        watch = _Watch(consumed)
        try:
            watch.arm(first.consumed)
            returned = child.ask(f"t {name}")
            seen = watch.wait()
        finally:
            watch.close()
    if seen is not None:
        newcomers.seeing[newcomers.last_source] += 1
    return _lag_us(returned, seen)


def _sync(env: Env, emu: EmulatorProcess, meter: str) -> list[Figure]:
    scale = env.scale
    polls: list[list[float]] = []
    trips: list[list[float]] = []
    subjects: list[list[float]] = []
    firsts: list[list[float]] = []
    timeouts = first_timeouts = 0
    followed, newcomers = _Followed("first_touch"), _Followed("new_instance")
    new_timeouts = 0
    news: list[list[float]] = []
    counter = env.client()
    counter.set(COUNTER, 0)
    written = _Watch(lambda: counter.get(COUNTER))
    child = _Child(_arguments("sync", env, emu, meter))
    try:
        with Outpost(
            access_token=emu.token, server_url=emu.url, redis_url=env.url, telemetry=True
        ) as reader:
            reader.balance(meter, external_customer_id=CUSTOMER)

            def consumed() -> float:
                found = reader.balance(meter, external_customer_id=followed.customer)
                followed.saw(found.source)
                return found.consumed

            watch = _Watch(consumed)
            try:
                for _ in range(scale.lag_rounds):
                    gc.collect()
                    out: list[float] = []
                    for _ in range(scale.lag_samples):
                        written.arm(counter.get(COUNTER))
                        returned = child.ask("i")
                        lag, late = _lag_us(returned, written.wait())
                        timeouts += late
                        out.append(lag)
                        time.sleep(_gap())
                    polls.append(out)
                    trips.append(_round_trips(lambda: counter.get(COUNTER), scale.lag_samples))
                    gc.collect()
                    out = []
                    for _ in range(scale.lag_samples):
                        watch.arm(consumed())
                        returned = child.ask("t")
                        lag, late = _lag_us(returned, watch.wait())
                        timeouts += late
                        out.append(lag)
                        time.sleep(_gap())
                    subjects.append(out)
                    out = []
                    for _ in range(scale.lag_first_touch):
                        name = followed.fresh_customer("sync")
                        first = reader.balance(meter, external_customer_id=name)
                        followed.first[first.source] += 1
                        watch.arm(first.consumed)
                        returned = child.ask(f"t {name}")
                        seen = watch.wait()
                        if seen is not None:
                            followed.seeing[followed.last_source] += 1
                        lag, late = _lag_us(returned, seen)
                        first_timeouts += late
                        out.append(lag)
                        time.sleep(_gap())
                    followed.customer = CUSTOMER
                    firsts.append(out)
                    out = []
                    for _ in range(scale.lag_new_instance):
                        lag, late = _newcomer_sync(env, emu, meter, child, newcomers)
                        new_timeouts += late
                        out.append(lag)
                        time.sleep(_gap())
                    news.append(out)
            finally:
                watch.close()
    finally:
        child.close()
        written.close()
    how = SETUP.format(poller="thread")
    return [
        _figure("sync", polls, trips, subjects, timeouts, how),
        _first_touch_figure("sync", subjects, firsts, trips, first_timeouts, followed, how),
        _first_touch_figure("sync", subjects, news, trips, new_timeouts, newcomers, how),
    ]


# -- async -----------------------------------------------------------------------------------


async def _async(env: Env, emu: EmulatorProcess, meter: str) -> list[Figure]:
    scale = env.scale
    pc = time.perf_counter_ns
    polls: list[list[float]] = []
    trips: list[list[float]] = []
    subjects: list[list[float]] = []
    firsts: list[list[float]] = []
    timeouts = first_timeouts = 0
    followed, newcomers = _Followed("first_touch"), _Followed("new_instance")
    new_timeouts = 0
    news: list[list[float]] = []
    counter = env.async_client()
    await counter.set(COUNTER, 0)
    arguments = _arguments("async", env, emu, meter)
    child = await asyncio.create_subprocess_exec(
        *arguments, cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert child.stdin is not None and child.stdout is not None
    child_in, child_out = child.stdin, child.stdout

    async def ask(command: str) -> int:
        child_in.write(command.encode() + b"\n")
        await child_in.drain()
        return int(await child_out.readline())

    try:
        if (await child_out.readline()).strip() != b"ready":
            raise RuntimeError("the tracking process did not start")
        async with AsyncOutpost(
            access_token=emu.token, server_url=emu.url, redis_url=env.url, telemetry=True
        ) as reader:
            await reader.balance(meter, external_customer_id=CUSTOMER)

            async def consumed() -> float:
                found = await reader.balance(meter, external_customer_id=followed.customer)
                followed.saw(found.source)
                return found.consumed

            async def count() -> Any:
                return await counter.get(COUNTER)

            async def moved(read: Callable[[], Awaitable[Any]], before: Any) -> int | None:
                deadline = pc() + int(TIMEOUT_S * 1e9)
                while await read() == before:
                    if pc() > deadline:
                        return None
                    await asyncio.sleep(0)
                return pc()

            async def sample(read: Callable[[], Awaitable[Any]], command: str) -> float:
                nonlocal timeouts
                poll = asyncio.get_running_loop().create_task(moved(read, await read()))
                await asyncio.sleep(0)  # the poller starts reading
                returned = await ask(command)
                lag, late = _lag_us(returned, await poll)
                timeouts += late
                await asyncio.sleep(_gap())
                return lag

            async def first_touch() -> float:
                nonlocal first_timeouts
                name = followed.fresh_customer("async")
                first = await reader.balance(meter, external_customer_id=name)
                followed.first[first.source] += 1
                poll = asyncio.get_running_loop().create_task(moved(consumed, first.consumed))
                await asyncio.sleep(0)  # the poller starts reading
                returned = await ask(f"t {name}")
                seen = await poll
                if seen is not None:
                    followed.seeing[followed.last_source] += 1
                lag, late = _lag_us(returned, seen)
                first_timeouts += late
                await asyncio.sleep(_gap())
                return lag

            async def newcomer() -> float:
                nonlocal new_timeouts
                name = newcomers.fresh_customer("async")
                async with AsyncOutpost(
                    access_token=emu.token, server_url=emu.url, redis_url=env.url, telemetry=True
                ) as instance:
                    first = await instance.balance(meter, external_customer_id=name)
                    newcomers.first[first.source] += 1

                    async def read() -> float:
                        found = await instance.balance(meter, external_customer_id=name)
                        newcomers.saw(found.source)
                        return found.consumed

                    poll = asyncio.get_running_loop().create_task(moved(read, first.consumed))
                    await asyncio.sleep(0)  # the poller starts reading
                    returned = await ask(f"t {name}")
                    seen = await poll
                if seen is not None:
                    newcomers.seeing[newcomers.last_source] += 1
                lag, late = _lag_us(returned, seen)
                new_timeouts += late
                await asyncio.sleep(_gap())
                return lag

            for _ in range(scale.lag_rounds):
                gc.collect()
                polls.append([await sample(count, "i") for _ in range(scale.lag_samples)])
                out: list[float] = []
                for _ in range(scale.lag_samples):
                    t0 = pc()
                    await count()
                    out.append((pc() - t0) / 1000.0)
                trips.append(out)
                gc.collect()
                subjects.append([await sample(consumed, "t") for _ in range(scale.lag_samples)])
                firsts.append([await first_touch() for _ in range(scale.lag_first_touch)])
                followed.customer = CUSTOMER
                news.append([await newcomer() for _ in range(scale.lag_new_instance)])
    finally:
        with contextlib.suppress(OSError):
            child_in.write(b"q\n")
            child_in.close()
        try:
            await asyncio.wait_for(child.wait(), 15)
        except TimeoutError:
            child.kill()
            await child.wait()
        await counter.aclose()
    how = SETUP.format(poller="task in the reader's event loop")
    return [
        _figure("async", polls, trips, subjects, timeouts, how),
        _first_touch_figure("async", subjects, firsts, trips, first_timeouts, followed, how),
        _first_touch_figure("async", subjects, news, trips, new_timeouts, newcomers, how),
    ]
