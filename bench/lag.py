"""The lag from ``track()`` returning on one instance to a read on another seeing it (D10: p99
within 2 ms on loopback), sync and async, against a bare redis-py ``SPUBLISH`` reaching a
subscriber on another connection (the floor of any cross-instance propagation).

A sample: note the other instance's ``consumed``, arm a poller that reads its warm ``balance()``
until that moves, ``track()`` one event on the first instance and note when it returned. The lag is
the poller's first sight minus that moment; it can be negative, when the other instance applied the
change before the tracking call got its reply back.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from bench._emulator import EmulatorProcess
from bench._env import Env
from bench._stats import Figure, Side, Target, round_ratio
from outpost_async import AsyncOutpost
from outpost_sync import Outpost

CUSTOMER = "bench-lag"
CHANNEL = "bench:lag"
TIMEOUT_S = 2.0
TARGET = Target(on="p99", op="<=", value=2000.0)
SETUP = (
    "Two instances in this process, each with its own Redis client, both connected to the "
    "emulator (so deliveries and acknowledgements run as in production), both warm. The other "
    "instance's balance() is polled from a {poller} that yields between reads; the baseline is "
    "SPUBLISH from one connection seen by {receiver} on another. Samples {gap}."
)
GAP = "are spaced 0.5-1.5 ms apart"


def run(env: Env) -> list[Figure]:
    env.reset()
    emu, meter = env.emulator, env.meter
    emu.grant_credits(meter, 1_000_000_000, external_customer_id=CUSTOMER)
    sync = _sync(env, emu, meter)
    asynchronous = asyncio.run(_async(env, emu, meter))
    return [sync, asynchronous]


def _figure(
    driver: str, bases: list[list[float]], subjects: list[list[float]], timeouts: int, how: str
) -> Figure:
    return Figure(
        key=f"lag.{driver}",
        title=f"track() on one instance → balance() on another, {driver}",
        unit="µs",
        subject=Side(f"cross-instance lag {driver}", [x for r in subjects for x in r]),
        baseline=Side(f"SPUBLISH → subscriber {driver}", [x for r in bases for x in r]),
        ratios=[round_ratio(s, b) for s, b in zip(subjects, bases, strict=True)],
        ratio_meaning="lag p50 / SPUBLISH p50 per round",
        setup=how,
        target=TARGET,
        extra={"timeouts": timeouts, "timeout_s": TIMEOUT_S},
    )


def _gap() -> float:
    return random.uniform(0.0005, 0.0015)


# -- sync ------------------------------------------------------------------------------------


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


def _sync(env: Env, emu: EmulatorProcess, meter: str) -> Figure:
    scale = env.scale
    pc = time.perf_counter_ns
    bases: list[list[float]] = []
    subjects: list[list[float]] = []
    timeouts = 0
    publisher = env.client()
    pubsub = env.client().pubsub()  # type: ignore[no-untyped-call]
    pubsub.ssubscribe(CHANNEL)
    received = _Receiver(pubsub)
    options: dict[str, Any] = dict(
        access_token=emu.token,
        server_url=emu.url,
        redis_url=env.url,
        telemetry=False,
    )
    with Outpost(**options) as a, Outpost(**options) as b:
        a.balance(meter, external_customer_id=CUSTOMER)
        b.balance(meter, external_customer_id=CUSTOMER)

        def consumed() -> float:
            return b.balance(meter, external_customer_id=CUSTOMER).consumed

        watch = _Watch(consumed)
        try:
            for _ in range(scale.lag_rounds):
                gc.collect()
                out: list[float] = []
                for n in range(scale.lag_samples):
                    received.arm()
                    publisher.spublish(CHANNEL, str(n))
                    returned = pc()
                    seen = received.wait()
                    if seen is None:
                        timeouts += 1
                        seen = returned + int(TIMEOUT_S * 1e9)
                    out.append((seen - returned) / 1000.0)
                    time.sleep(_gap())
                bases.append(out)
                gc.collect()
                out = []
                for _ in range(scale.lag_samples):
                    watch.arm(consumed())
                    a.track("api_call", external_customer_id=CUSTOMER)
                    returned = pc()
                    seen = watch.wait()
                    if seen is None:
                        timeouts += 1
                        seen = returned + int(TIMEOUT_S * 1e9)
                    out.append((seen - returned) / 1000.0)
                    time.sleep(_gap())
                subjects.append(out)
        finally:
            watch.close()
            received.close()
            pubsub.close()
    how = SETUP.format(
        poller="thread",
        receiver="a thread blocked in pubsub.get_message",
        gap=GAP,
    )
    return _figure("sync", bases, subjects, timeouts, how)


class _Receiver:
    """A thread blocked on a subscription; notes when each message arrives."""

    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub
        self.seen_at: int | None = None
        self._seen = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="bench-lag-receiver", daemon=True)
        self._thread.start()

    def arm(self) -> None:
        self.seen_at = None
        self._seen.clear()

    def wait(self) -> int | None:
        self._seen.wait(TIMEOUT_S)
        return self.seen_at

    def close(self) -> None:
        self._closed = True
        self._thread.join(5)

    def _loop(self) -> None:
        pc = time.perf_counter_ns
        while not self._closed:
            message = self._pubsub.get_message(timeout=0.1)
            if message is not None and message.get("type") in ("smessage", b"smessage"):
                self.seen_at = pc()
                self._seen.set()


# -- async -----------------------------------------------------------------------------------


async def _async(env: Env, emu: EmulatorProcess, meter: str) -> Figure:
    scale = env.scale
    pc = time.perf_counter_ns
    bases: list[list[float]] = []
    subjects: list[list[float]] = []
    timeouts = 0
    publisher = env.async_client()
    listener = env.async_client()
    pubsub = listener.pubsub()
    await pubsub.ssubscribe(CHANNEL)
    arrivals: asyncio.Queue[int] = asyncio.Queue()

    async def receive() -> None:
        while True:
            message = await pubsub.get_message(timeout=0.1)
            if message is not None and message.get("type") in ("smessage", b"smessage"):
                arrivals.put_nowait(pc())

    receiver = asyncio.get_running_loop().create_task(receive())
    options: dict[str, Any] = dict(
        access_token=emu.token,
        server_url=emu.url,
        redis_url=env.url,
        telemetry=False,
    )
    try:
        async with AsyncOutpost(**options) as a, AsyncOutpost(**options) as b:
            await a.balance(meter, external_customer_id=CUSTOMER)
            await b.balance(meter, external_customer_id=CUSTOMER)

            async def consumed() -> float:
                return (await b.balance(meter, external_customer_id=CUSTOMER)).consumed

            async def moved(before: float) -> int | None:
                deadline = pc() + int(TIMEOUT_S * 1e9)
                while await consumed() == before:
                    if pc() > deadline:
                        return None
                    await asyncio.sleep(0)
                return pc()

            for _ in range(scale.lag_rounds):
                gc.collect()
                out: list[float] = []
                for n in range(scale.lag_samples):
                    await publisher.spublish(CHANNEL, str(n))
                    returned = pc()
                    try:
                        seen: int | None = await asyncio.wait_for(arrivals.get(), TIMEOUT_S)
                    except TimeoutError:
                        seen = None
                    if seen is None:
                        timeouts += 1
                        seen = returned + int(TIMEOUT_S * 1e9)
                    out.append((seen - returned) / 1000.0)
                    await asyncio.sleep(_gap())
                bases.append(out)
                gc.collect()
                out = []
                for _ in range(scale.lag_samples):
                    poll = asyncio.get_running_loop().create_task(moved(await consumed()))
                    await asyncio.sleep(0)  # the poller starts reading
                    await a.track("api_call", external_customer_id=CUSTOMER)
                    returned = pc()
                    seen = await poll
                    if seen is None:
                        timeouts += 1
                        seen = returned + int(TIMEOUT_S * 1e9)
                    out.append((seen - returned) / 1000.0)
                    await asyncio.sleep(_gap())
                subjects.append(out)
    finally:
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await receiver
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await listener.aclose()
        await publisher.aclose()
    how = SETUP.format(
        poller="task (in the same event loop as both instances)",
        receiver="a task awaiting pubsub.get_message",
        gap=GAP,
    )
    return _figure("async", bases, subjects, timeouts, how)
