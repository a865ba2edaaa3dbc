"""The demo's admission step: a customer at zero gets a few credits, then both instances race for
them with `reserve()`, many more attempts than the credits, and exactly the credits are admitted.

Each attempt holds 1 unit, does a little "work" while holding it, and commits one `api_call`
event of 1 token; a refused attempt raises `InsufficientBalance` and holds nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from outpost_core import InsufficientBalance, OutpostError
from outpost_emulator._server import Emulator
from outpost_sync import Outpost

CREDITS = 5
THREADS = 8  # per instance
ATTEMPTS = 3  # per thread
WORK = 0.01  # wall seconds a reservation is held before its commit: holds overlap


@dataclass
class Race:
    """What the race admitted and refused, per instance (A, B)."""

    external_id: str
    credits: int = CREDITS
    admitted: list[int] = field(default_factory=lambda: [0, 0])
    refused: list[int] = field(default_factory=lambda: [0, 0])
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def attempts(self) -> int:
        return sum(self.admitted) + sum(self.refused) + len(self.errors)

    def problems(self, emulator: Emulator, meter_id: str) -> list[str]:
        """Why the race is not exact: the instances admitted other than the credits, or Polar
        does not count exactly what they admitted (yet: the verdict waits for delivery)."""
        who = self.external_id
        found = []
        if self.errors:
            found.append(f"{who}: {len(self.errors)} reservations raised; first: {self.errors[0]}")
        if sum(self.admitted) != self.credits:
            found.append(f"{who}: {sum(self.admitted)} reservations admitted for {self.credits}")
        polar = emulator.customer_meter(meter_id, external_customer_id=who)
        if float(polar["consumed_units"]) != sum(self.admitted):
            found.append(
                f"{who}: Polar counts {polar['consumed_units']} units, "
                f"the instances admitted {sum(self.admitted)}"
            )
        return found


def race(
    emulator: Emulator,
    meter_id: str,
    instances: list[Outpost],
    external_id: str,
    say: Callable[[str], None],
) -> Race:
    """Show the customer refused at zero, grant it credits, and race both instances for them."""
    result = Race(external_id)
    for instance in instances:  # a first read waits for Polar's snapshot
        _wait_for_balance(instance, meter_id, external_id, 0)
    refusals = 0
    for instance in instances:
        try:
            instance.reserve(meter_id, 1, external_customer_id=external_id).release()
        except InsufficientBalance:
            refusals += 1
    say(
        f"{external_id} has no credits: reserve() on "
        + ("A and B refuses it" if refusals == 2 else f"{refusals} of A and B refuses it")
    )
    emulator.grant_credits(meter_id, CREDITS, external_customer_id=external_id)
    for instance in instances:
        _wait_for_balance(instance, meter_id, external_id, CREDITS)
    threads = THREADS * len(instances)
    say(
        f"it buys {CREDITS} credits; A and B race {threads} threads x {ATTEMPTS} reserve(1) + "
        f"commit() for them ({threads * ATTEMPTS} attempts)"
    )
    start = threading.Barrier(threads)
    workers = [
        threading.Thread(
            target=_attempts,
            args=(result, n, instance, meter_id, start),
            name=f"demo-race-{'AB'[n]}{k}",
            daemon=True,
        )
        for n, instance in enumerate(instances)
        for k in range(THREADS)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    a, b = result.admitted
    say(
        f"admitted {sum(result.admitted)} (A {a}, B {b}), refused {sum(result.refused)} "
        f"with InsufficientBalance (A {result.refused[0]}, B {result.refused[1]})"
        + (f", {len(result.errors)} errors" if result.errors else "")
    )
    return result


def _attempts(
    result: Race, n: int, instance: Outpost, meter_id: str, start: threading.Barrier
) -> None:
    with contextlib.suppress(threading.BrokenBarrierError):  # a late thread: race anyway
        start.wait(timeout=10)
    for _ in range(ATTEMPTS):
        try:
            with instance.reserve(meter_id, 1, external_customer_id=result.external_id) as held:
                time.sleep(WORK)  # the request's work, with the unit held
                held.commit("api_call", metadata={"tokens": 1, "instance": "AB"[n]})
            with result.lock:
                result.admitted[n] += 1
        except InsufficientBalance:
            with result.lock:
                result.refused[n] += 1
        except OutpostError as exc:
            with result.lock:
                result.errors.append(f"instance {'AB'[n]}: {type(exc).__name__}: {exc}")


def _wait_for_balance(instance: Outpost, meter_id: str, external_id: str, value: float) -> None:
    """Until the instance reads `value` (Polar's snapshot pushed after a grant), 10 s at most."""
    deadline = time.monotonic() + 10
    while True:
        balance = instance.balance(meter_id, external_customer_id=external_id)
        if balance.balance == value or time.monotonic() > deadline:
            return
        time.sleep(0.02)
