"""The cross-instance lag under load: two instances track as fast as they can while a
third reads, sync and async, against a redis-py ``GET`` round trip taken by the reader under the
same load.

Three processes share one Redis and the emulator: two trackers (``bench._loader``) and the reader
(here). Each tracker tracks back to back for a customer the reader also follows (HOT, so the
reader's subscriber applies every change, as it would in an application reading what it tracks)
and, every 4-8 ms, one event for its own PROBE customer, noting when that ``track()`` returned. A
poller in the reader reads both PROBE balances in a loop; the k-th PROBE event is seen when the
PROBE's consumed count reaches k. The lag of a probe is the poller's first sight minus the
tracker's return (``perf_counter_ns``: CLOCK_MONOTONIC, one clock for every process); a probe never
seen within ``TIMEOUT_S`` of the round's end counts as ``TIMEOUT_S``.

Each round runs twice, one after the other: as above, then with the reader tracking flat out too
(``lag_under_load.*.reader_tracks``), for a customer of its own, as an application that both
tracks and reads: its own tracks' echoes reach its subscriber beside the others' changes (and, in
the sync driver, its tracking thread shares the GIL with the subscriber and the poller). That
figure's baseline is the first run of the same round, so its ratio is what the reader's own
tracking adds to the lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from bench._child import AsyncChildProcess, ChildProcess
from bench._emulator import EmulatorProcess
from bench._env import Env
from bench._loader import TASKS
from bench._stats import Figure, Side, percentile, round_ratio
from bench.lag import TARGET
from outpost_async import AsyncOutpost
from outpost_core import Balance
from outpost_sync import Outpost

TIMEOUT_S = 2.0
TRACKERS = 2
SETUP = (
    "Three processes, each with its own Redis client, all connected to the emulator "
    "(deliveries and acknowledgements run as in production): two tracking instances, each "
    "tracking back to back ({how}) for a customer the reader follows, plus one probe event for "
    "its own customer every 4-8 ms; and the reader, whose poller ({poller}) reads both probe "
    "customers' balance() in a loop, yielding between reads. Baseline: redis-py GET round trips "
    "from the reader's process during the same load, 1-3 ms apart."
)
READER_TRACKS = (
    " Here the reader also tracks back to back ({how}) for a customer of its own during "
    "the run; baseline: the run just before it, the same round, where it only read."
)


def run(env: Env) -> list[Figure]:
    emu, meter = env.start()
    sync = _sync(env, emu, meter)
    asynchronous = asyncio.run(_async(env, emu, meter))
    return [sync[0], asynchronous[0], sync[1], asynchronous[1]]


def _names(driver: str) -> tuple[str, list[str]]:
    return f"bench-load-hot-{driver}", [f"bench-load-probe-{driver}-{n}" for n in range(TRACKERS)]


def _own(driver: str) -> str:
    """The customer the reader tracks for in the rounds where it tracks too."""
    return f"bench-load-own-{driver}"


def _arguments(driver: str, env: Env, emu: EmulatorProcess, meter: str, probe: str) -> list[str]:
    hot, _ = _names(driver)
    return [
        sys.executable,
        "-m",
        "bench._loader",
        driver,
        env.url,
        emu.url,
        emu.token,
        meter,
        hot,
        probe,
    ]


def _last_probes(probes: list[str], answers: list[dict[str, Any]]) -> dict[str, int]:
    """The last probe event each tracker tracked this round (0 when none)."""
    return {
        probe: answer["probes"][-1][0] if answer["probes"] else 0
        for probe, answer in zip(probes, answers, strict=True)
    }


def _until_seen(
    sight: _Sight,
    probes: list[str],
    answers: list[dict[str, Any]],
    progress: threading.Event | asyncio.Event,
) -> Iterator[float]:
    """The seconds left to wait for the poller's progress, as long as it has not seen the last
    probe event of every tracker this round and ``TIMEOUT_S`` has not passed since the round."""
    last = _last_probes(probes, answers)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        progress.clear()
        remaining = deadline - time.monotonic()
        if sight.has_seen(last) or remaining <= 0:
            return
        yield remaining


class _Sight:
    """What the poller saw: for each probe customer, when its consumed count reached each k."""

    def __init__(self, probes: list[str], moved: Callable[[], None]) -> None:
        self.moved = moved  # called whenever a probe's count moves
        self.high = dict.fromkeys(probes, 0)
        self.seen: dict[str, dict[int, int]] = {p: {} for p in probes}
        self.sources: Counter[str] = Counter()

    def look(self, probe: str, found: Balance) -> None:
        self.sources[found.source] += 1
        count = int(found.consumed)
        if count > self.high[probe]:
            now = time.perf_counter_ns()
            for k in range(self.high[probe] + 1, count + 1):
                self.seen[probe][k] = now
            self.high[probe] = count
            self.moved()

    def has_seen(self, last: dict[str, int]) -> bool:
        return all(self.high[p] >= k for p, k in last.items())


class _Round:
    """What each round gathers."""

    def __init__(self) -> None:
        self.lags: list[list[float]] = []
        self.trips: list[list[float]] = []
        self.tracks = 0
        self.seconds = 0.0
        self.timeouts = 0
        self.probes = 0
        self.own_tracks = 0  # the reader's own, in the rounds where it tracks too

    def add(
        self, sight: _Sight, probes: list[str], answers: list[dict[str, Any]], trips: list[float]
    ) -> None:
        lags = []
        for probe, answer in zip(probes, answers, strict=True):
            self.tracks += int(answer["tracks"])
            for k, returned in answer["probes"]:
                seen = sight.seen[probe].get(k)
                if seen is None:
                    lags.append(TIMEOUT_S * 1e6)
                    self.timeouts += 1
                else:
                    lags.append((seen - returned) / 1000.0)
        self.probes += len(lags)
        self.lags.append(lags)
        self.trips.append(trips)

    @property
    def _subject(self) -> list[float]:
        return [x for r in self.lags for x in r]

    def _lag_extra(self) -> dict[str, Any]:
        """What both figures tell of their lags beside the percentiles."""
        subject = self._subject
        return {
            "lag_max_us": max(subject) if subject else float("nan"),
            "lag_p90_us": percentile(subject, 90),
            "probes": self.probes,
            "timeouts": self.timeouts,
        }

    def reader_tracks_figure(self, driver: str, quiet: _Round, how: str) -> Figure:
        """The lag of these rounds, where the reader tracked too, against ``quiet``'s (the same
        rounds' runs where it only read)."""
        per_s = self.own_tracks / self.seconds if self.seconds else 0.0
        return Figure(
            key=f"lag_under_load.{driver}.reader_tracks",
            title=f"the same, the reader tracking flat out too, {driver}",
            unit="µs",
            subject=Side(f"lag under load, reader tracking {driver}", self._subject),
            baseline=Side(f"lag under load {driver}", quiet._subject),
            ratios=[round_ratio(s, b) for s, b in zip(self.lags, quiet.lags, strict=True)],
            ratio_meaning="lag p50 with the reader tracking / without, per round",
            setup=how,
            extra=self._lag_extra()
            | {"reader_tracks": self.own_tracks, "reader_tracks_per_s": per_s},
        )

    def figure(self, driver: str, sight: _Sight, how: str) -> Figure:
        subject = self._subject
        reads = sum(sight.sources.values())
        from_redis = sight.sources["redis"] / reads if reads else 0.0
        return Figure(
            key=f"lag_under_load.{driver}",
            title=f"track() in one of two busy processes → balance() in a third, {driver}",
            unit="µs",
            subject=Side(f"lag under load {driver}", subject),
            baseline=Side(f"GET under load {driver}", [x for r in self.trips for x in r]),
            ratios=[round_ratio(s, b) for s, b in zip(self.lags, self.trips, strict=True)],
            ratio_meaning="lag p50 / GET round-trip p50 per round, both under the same load",
            setup=how,
            target=TARGET,
            extra=self._lag_extra()
            | {
                "negative_lags": sum(1 for x in subject if x < 0),
                "negative_note": "a lag is negative when the reader saw the event before the "
                "tracker's track() call returned: the tracking process was busy (its other "
                "tracks, its subscriber) or descheduled between Redis's reply and the return",
                "timeout_s": TIMEOUT_S,
                "tracks_per_s_both_trackers": self.tracks / self.seconds if self.seconds else 0.0,
                "reader_reads": reads,
                "reader_reads_from_redis_fraction": from_redis,
            },
        )


def _get_round_trips(call: Callable[[], Any], seconds: float) -> list[float]:
    pc = time.perf_counter_ns
    end = pc() + int(seconds * 1e9)
    out = []
    while pc() < end:
        t0 = pc()
        call()
        out.append((pc() - t0) / 1000.0)
        time.sleep(random.uniform(0.001, 0.003))
    return out


# -- sync ------------------------------------------------------------------------------------


class _Loader(ChildProcess):
    """A loading process (``_loader``): tracks flat out on ``go``, then answers what it did."""

    def go(self, seconds: float) -> None:
        self.send(f"go {seconds}")

    def answer(self) -> dict[str, Any]:
        answer: dict[str, Any] = json.loads(self.line())
        return answer


def _sync(env: Env, emu: EmulatorProcess, meter: str) -> tuple[Figure, Figure]:
    scale = env.scale
    hot, probes = _names("sync")
    loaders = [_Loader(_arguments("sync", env, emu, meter, p)) for p in probes]
    gathered, busy = _Round(), _Round()
    progress = threading.Event()
    sight = _Sight(probes, progress.set)
    client = env.client()
    stop, tracking = threading.Event(), threading.Event()
    try:
        for loader in loaders:
            loader.ready()
        with Outpost(
            access_token=emu.token, server_url=emu.url, redis_url=env.url, telemetry=False
        ) as reader:
            reader.balance(meter, external_customer_id=hot)
            for probe in probes:
                reader.balance(meter, external_customer_id=probe)

            def poll() -> None:
                while not stop.is_set():
                    for probe in probes:
                        sight.look(probe, reader.balance(meter, external_customer_id=probe))
                    time.sleep(0)  # hand the GIL over: the subscriber thread must run

            def own_tracks() -> None:  # the reader's own traffic, in the rounds that want it
                while not stop.is_set():
                    if tracking.wait(0.05):
                        reader.track("api_call", external_customer_id=_own("sync"))
                        busy.own_tracks += 1

            workers = [
                threading.Thread(target=poll, name="bench-load-poller", daemon=True),
                threading.Thread(target=own_tracks, name="bench-load-own", daemon=True),
            ]
            for worker in workers:
                worker.start()
            try:
                for _ in range(scale.load_rounds):
                    for rounds in (gathered, busy):
                        gc.collect()
                        if rounds is busy:
                            tracking.set()
                        for loader in loaders:
                            loader.go(scale.load_seconds)
                        started = time.monotonic()
                        trips = _get_round_trips(
                            lambda: client.get("bench:load"), scale.load_seconds
                        )
                        answers = [loader.answer() for loader in loaders]
                        tracking.clear()
                        rounds.seconds += time.monotonic() - started
                        for remaining in _until_seen(sight, probes, answers, progress):
                            progress.wait(remaining)
                        rounds.add(sight, probes, answers, trips)
            finally:
                stop.set()
                for worker in workers:
                    worker.join(5)
    finally:
        for loader in loaders:
            loader.close()
    how = SETUP.format(how="one thread", poller="a thread")
    return (
        gathered.figure("sync", sight, how),
        busy.reader_tracks_figure("sync", gathered, how + READER_TRACKS.format(how="a thread")),
    )


# -- async -----------------------------------------------------------------------------------


async def _async(env: Env, emu: EmulatorProcess, meter: str) -> tuple[Figure, Figure]:
    scale = env.scale
    hot, probes = _names("async")
    children = [
        await AsyncChildProcess.start(_arguments("async", env, emu, meter, p)) for p in probes
    ]
    gathered, busy = _Round(), _Round()
    progress = asyncio.Event()
    sight = _Sight(probes, progress.set)
    client = env.async_client()
    stopped, tracking = False, False

    async def trips(seconds: float) -> list[float]:
        pc = time.perf_counter_ns
        end = pc() + int(seconds * 1e9)
        out = []
        while pc() < end:
            t0 = pc()
            await client.get("bench:load")
            out.append((pc() - t0) / 1000.0)
            await asyncio.sleep(random.uniform(0.001, 0.003))
        return out

    try:
        for child in children:
            await child.ready()
        async with AsyncOutpost(
            access_token=emu.token, server_url=emu.url, redis_url=env.url, telemetry=False
        ) as reader:
            await reader.balance(meter, external_customer_id=hot)
            for probe in probes:
                await reader.balance(meter, external_customer_id=probe)

            async def poll() -> None:
                while not stopped:
                    for probe in probes:
                        sight.look(probe, await reader.balance(meter, external_customer_id=probe))
                    await asyncio.sleep(0)

            async def own_tracks() -> None:  # the reader's own traffic, in the rounds that want it
                while not stopped:
                    if tracking:
                        await reader.track("api_call", external_customer_id=_own("async"))
                        busy.own_tracks += 1
                    else:
                        await asyncio.sleep(0.01)

            loop = asyncio.get_running_loop()
            workers = [loop.create_task(poll()), loop.create_task(own_tracks())]
            try:
                for _ in range(scale.load_rounds):
                    for rounds in (gathered, busy):
                        gc.collect()
                        tracking = rounds is busy
                        for child in children:
                            await child.send(f"go {scale.load_seconds}")
                        started = time.monotonic()
                        taken = await trips(scale.load_seconds)
                        answers = [json.loads(await child.line()) for child in children]
                        tracking = False
                        rounds.seconds += time.monotonic() - started
                        for remaining in _until_seen(sight, probes, answers, progress):
                            with contextlib.suppress(TimeoutError):
                                await asyncio.wait_for(progress.wait(), remaining)
                        rounds.add(sight, probes, answers, taken)
            finally:
                stopped = True
                for worker in workers:
                    await worker
    finally:
        for child in children:
            await child.close()
        await client.aclose()
    how = SETUP.format(how=f"{TASKS} tasks", poller="a task in the reader's event loop")
    reader_how = how + READER_TRACKS.format(how="one task in its event loop")
    return gathered.figure("async", sight, how), busy.reader_tracks_figure(
        "async", gathered, reader_how
    )
