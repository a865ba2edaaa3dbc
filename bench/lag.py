"""The lag from ``track()`` returning on one instance to a read on another seeing it (target: p99
within 1.5 ms on loopback), sync and async, against one redis-py ``GET`` round trip (the ratio says
how many round trips the propagation takes); the JSON also gives the same lag without Outpost (a
redis-py write in one process seen by another polling Redis with ``GET``).

The two instances live in two processes, as two instances of an application would: the tracking
one in a child process (``bench._tracker``), the reading one here. A sample: note the reader's
``consumed``, arm a poller that reads its warm ``balance()`` until that moves, have the child
``track()`` one event and report the moment its call returned (``perf_counter_ns``:
CLOCK_MONOTONIC, common to both processes). The lag is the poller's first sight minus that moment.
The no-Outpost samples are taken the same way: the child ``INCR``s a key, a poller here ``GET``s
it until it moves (each look is then a round trip to Redis, where the SDK's is a memory read).

First touch (``lag.*.first_touch``): the same lag, but each sample uses a customer the
reader has never read: its first ``balance()`` returns, then the child tracks for that customer at
once, then the poller reads it until it moves. New instance (``lag.*.new_instance``): the same
with a reading instance started for the sample (its very first read),
closed after. Baseline of both: the warm-customer lag of the same rounds.
The JSON says where the reads were answered from (``Balance.source``: memory, or Redis when the copy
was not following Redis yet).

Every instance runs with telemetry on, as a user runs it; ``POLAR_OUTPOST_TELEMETRY=0 python -m
bench --only lag`` gives the same rows with it off (the child inherits the variable).
"""

from __future__ import annotations

import asyncio
import gc
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from bench._child import AsyncChildProcess, ChildProcess
from bench._emulator import EmulatorProcess
from bench._env import Env
from bench._stats import Figure, Side, Target, percentile, round_ratio
from outpost_async import AsyncOutpost
from outpost_core import Balance
from outpost_sync import Outpost

CUSTOMER = "bench-lag"
COUNTER = "bench:lag:counter"
TIMEOUT_S = 2.0
TARGET = Target(on="p99", op="<=", value=1500.0)  # µs: docs/design.md, speed targets
SETUP = (
    "Two instances, each in its own process with its own Redis client, both connected to the "
    "emulator (deliveries and acknowledgements run as in production), both warm; the tracking "
    "one in a child process. The reader's balance() is polled by a {poller} that yields between "
    "reads (time.sleep(0) / asyncio.sleep(0)). Samples are 0.5-1.5 ms apart. Baseline: one "
    "redis-py GET round trip from the reader's process, in the same rounds; extra: the same "
    "lag without Outpost (INCR in the child, GET polled here)."
)


def run(env: Env) -> list[Figure]:
    emu, meter = env.start(CUSTOMER, credits=1_000_000_000)
    sync = _sync(env, emu, meter)
    asynchronous = asyncio.run(_async(env, emu, meter))
    return [*sync, *asynchronous]


class _Lags:
    """Turns a sample's two moments into its lag, counting the samples never seen."""

    def __init__(self) -> None:
        self.timeouts = 0

    def lag(self, returned: int, seen: int | None) -> float:
        """µs from the child's call returning to the poller's sight (``TIMEOUT_S`` if none)."""
        if seen is None:
            self.timeouts += 1
            return TIMEOUT_S * 1e6
        return (seen - returned) / 1000.0


class _Followed(_Lags):
    """Which customer the poller reads, and where the reads were answered from."""

    def __init__(self, kind: str) -> None:
        super().__init__()
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

    def first_read(self, found: Balance) -> float:
        """Notes where a fresh customer's first read was answered from; its consumed count."""
        self.first[found.source] += 1
        return found.consumed

    def lag(self, returned: int, seen: int | None) -> float:
        if seen is not None:
            self.seeing[self.last_source] += 1
        return super().lag(returned, seen)


KINDS = {
    "first_touch": ("first-touch", "a customer the reader never read"),
    "new_instance": ("new-instance", "a new reading instance's first customer"),
}


class _Rounds(_Lags):
    """What one driver's rounds gather: the lags (``timeouts`` counts the warm-customer and INCR
    samples'), the GET round trips, and the first-touch and new-instance samples."""

    def __init__(self) -> None:
        super().__init__()
        self.polls: list[list[float]] = []  # INCR in the child seen by GET polling here
        self.trips: list[list[float]] = []
        self.subjects: list[list[float]] = []  # the warm customer's lag
        self.firsts: list[list[float]] = []
        self.news: list[list[float]] = []
        self.followed = _Followed("first_touch")
        self.newcomers = _Followed("new_instance")

    def figures(self, driver: str, how: str) -> list[Figure]:
        return [
            _figure(driver, self, how),
            _first_touch_figure(driver, self, self.firsts, self.followed, how),
            _first_touch_figure(driver, self, self.news, self.newcomers, how),
        ]


def _lag_figure(
    key: str,
    title: str,
    subject: tuple[str, list[list[float]]],
    baseline: tuple[str, list[list[float]]],
    ratio_meaning: str,
    how: str,
    extra: dict[str, Any],
) -> Figure:
    """A lag row: each side every sample of every round (µs, labelled), the ratio per round
    their p50s', the lag target."""
    (label, lags), (base_label, base) = subject, baseline
    return Figure(
        key=key,
        title=title,
        unit="µs",
        subject=Side(label, [x for r in lags for x in r]),
        baseline=Side(base_label, [x for r in base for x in r]),
        ratios=[round_ratio(s, b) for s, b in zip(lags, base, strict=True)],
        ratio_meaning=ratio_meaning,
        setup=how,
        target=TARGET,
        extra=extra,
    )


def _first_touch_figure(
    driver: str, rounds: _Rounds, firsts: list[list[float]], followed: _Followed, how: str
) -> Figure:
    every = [x for r in rounds.trips for x in r]
    polls = sum(followed.polls.values())
    label, what = KINDS[followed.kind]
    return _lag_figure(
        f"lag.{driver}.{followed.kind}",
        f"track() in one process → balance() of {what} in another, {driver}",
        (f"{label} lag {driver}", firsts),
        (f"warm-customer lag {driver}", rounds.subjects),
        f"{label} lag p50 / warm-customer lag p50 per round",
        how,
        {
            "customers": sum(followed.first.values()),
            "timeouts": followed.timeouts,
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


def _figure(driver: str, rounds: _Rounds, how: str) -> Figure:
    polled = [x for r in rounds.polls for x in r]
    return _lag_figure(
        f"lag.{driver}",
        f"track() in one process → balance() in another, {driver}",
        (f"cross-instance lag {driver}", rounds.subjects),
        (f"GET round trip {driver}", rounds.trips),
        "lag p50 / GET round-trip p50 per round (how many round trips it takes)",
        how,
        {
            "timeouts": rounds.timeouts,
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
        self.read = read
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
                if self.read() != before:
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


def _sample(watch: _Watch, before: Any, child: _Child, command: str, lags: _Lags) -> float:
    """One lag: the watch armed at ``before``, the child runs ``command``; then a gap."""
    watch.arm(before)
    returned = child.ask(command)
    lag = lags.lag(returned, watch.wait())
    time.sleep(_gap())
    return lag


def _newcomer_sync(
    env: Env, emu: EmulatorProcess, meter: str, child: _Child, newcomers: _Followed
) -> float:
    """A new instance's first read of a new customer, then the child's track, then its reads."""
    name = newcomers.fresh_customer("sync")
    with Outpost(
        access_token=emu.token, server_url=emu.url, redis_url=env.url, telemetry=True
    ) as newcomer:
        first = newcomers.first_read(newcomer.balance(meter, external_customer_id=name))

        def consumed() -> float:
            found = newcomer.balance(meter, external_customer_id=name)
            newcomers.saw(found.source)
            return found.consumed

        watch = _Watch(consumed)
        try:
            return _sample(watch, first, child, f"t {name}", newcomers)
        finally:
            watch.close()


def _sync(env: Env, emu: EmulatorProcess, meter: str) -> list[Figure]:
    scale = env.scale
    rounds = _Rounds()
    followed = rounds.followed
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

            def first_touch() -> float:
                name = followed.fresh_customer("sync")
                first = followed.first_read(reader.balance(meter, external_customer_id=name))
                return _sample(watch, first, child, f"t {name}", followed)

            try:
                for _ in range(scale.lag_rounds):
                    gc.collect()
                    rounds.polls.append(
                        [
                            _sample(written, counter.get(COUNTER), child, "i", rounds)
                            for _ in range(scale.lag_samples)
                        ]
                    )
                    trips = _round_trips(lambda: counter.get(COUNTER), scale.lag_samples)
                    rounds.trips.append(trips)
                    gc.collect()
                    rounds.subjects.append(
                        [
                            _sample(watch, consumed(), child, "t", rounds)
                            for _ in range(scale.lag_samples)
                        ]
                    )
                    rounds.firsts.append([first_touch() for _ in range(scale.lag_first_touch)])
                    followed.customer = CUSTOMER
                    rounds.news.append(
                        [
                            _newcomer_sync(env, emu, meter, child, rounds.newcomers)
                            for _ in range(scale.lag_new_instance)
                        ]
                    )
            finally:
                watch.close()
    finally:
        child.close()
        written.close()
    return rounds.figures("sync", SETUP.format(poller="thread"))


# -- async -----------------------------------------------------------------------------------


async def _async(env: Env, emu: EmulatorProcess, meter: str) -> list[Figure]:
    scale = env.scale
    pc = time.perf_counter_ns
    rounds = _Rounds()
    followed, newcomers = rounds.followed, rounds.newcomers
    counter = env.async_client()
    await counter.set(COUNTER, 0)
    child = await AsyncChildProcess.start(_arguments("async", env, emu, meter))

    async def ask(command: str) -> int:
        await child.send(command)
        return int(await child.line())

    try:
        await child.ready()
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

            async def sample(
                read: Callable[[], Awaitable[Any]], before: Any, command: str, lags: _Lags
            ) -> float:
                """One lag: a poller task reads until ``before`` moves, the child runs
                ``command``; then a gap."""
                poll = asyncio.get_running_loop().create_task(moved(read, before))
                await asyncio.sleep(0)  # the poller starts reading
                returned = await ask(command)
                lag = lags.lag(returned, await poll)
                await asyncio.sleep(_gap())
                return lag

            async def first_touch() -> float:
                name = followed.fresh_customer("async")
                first = followed.first_read(await reader.balance(meter, external_customer_id=name))
                return await sample(consumed, first, f"t {name}", followed)

            async def newcomer() -> float:
                name = newcomers.fresh_customer("async")
                async with AsyncOutpost(
                    access_token=emu.token, server_url=emu.url, redis_url=env.url, telemetry=True
                ) as instance:
                    found = await instance.balance(meter, external_customer_id=name)
                    first = newcomers.first_read(found)

                    async def read() -> float:
                        found = await instance.balance(meter, external_customer_id=name)
                        newcomers.saw(found.source)
                        return found.consumed

                    return await sample(read, first, f"t {name}", newcomers)

            for _ in range(scale.lag_rounds):
                gc.collect()
                rounds.polls.append(
                    [
                        await sample(count, await count(), "i", rounds)
                        for _ in range(scale.lag_samples)
                    ]
                )
                out: list[float] = []
                for _ in range(scale.lag_samples):
                    t0 = pc()
                    await count()
                    out.append((pc() - t0) / 1000.0)
                rounds.trips.append(out)
                gc.collect()
                rounds.subjects.append(
                    [
                        await sample(consumed, await consumed(), "t", rounds)
                        for _ in range(scale.lag_samples)
                    ]
                )
                rounds.firsts.append([await first_touch() for _ in range(scale.lag_first_touch)])
                followed.customer = CUSTOMER
                rounds.news.append([await newcomer() for _ in range(scale.lag_new_instance)])
    finally:
        await child.close()
        await counter.aclose()
    return rounds.figures("async", SETUP.format(poller="task in the reader's event loop"))
