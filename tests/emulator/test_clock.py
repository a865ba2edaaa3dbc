from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from outpost_emulator import EmulatorClock
from tests.emulator.helpers import START, START_US, wait_for


def test_frozen_clock_only_moves_when_told() -> None:
    clock = EmulatorClock(START, frozen=True)
    assert clock.now_us() == START_US
    assert clock.now() == START
    assert clock.now().tzinfo is not None
    clock.advance(1.5)
    assert clock.now_us() == START_US + 1_500_000
    clock.advance(0.000001)
    assert clock.now_us() == START_US + 1_500_001
    assert clock.frozen


def test_set_jumps_both_ways() -> None:
    clock = EmulatorClock(START, frozen=True)
    clock.set(START + timedelta(hours=2))
    assert clock.now() == START + timedelta(hours=2)
    clock.set(START - timedelta(days=1))
    assert clock.now() == START - timedelta(days=1)


def test_running_clock_never_behind_the_wall_clock() -> None:
    clock = EmulatorClock(speed=50)
    for _ in range(200):
        wall = time.time_ns() // 1000
        assert clock.now_us() >= wall
    start = clock.now_us()
    # At 50x, one virtual second passes in about 20 ms of wall time.
    wait_for(lambda: clock.now_us() - start >= 1_000_000, "a virtual second")


def test_unfreeze_continues_from_the_frozen_instant() -> None:
    clock = EmulatorClock(START, frozen=True)
    clock.unfreeze()
    assert not clock.frozen
    assert clock.now_us() >= START_US
    assert clock.now_us() < START_US + 60_000_000  # did not jump to the wall clock
    clock.freeze()
    frozen_at = clock.now_us()
    assert clock.now_us() == frozen_at


def test_speed_change_keeps_the_current_instant() -> None:
    clock = EmulatorClock(START, frozen=True)
    clock.set_speed(10)
    assert clock.speed == 10
    assert clock.now_us() == START_US


def test_readings_are_monotonic_across_threads() -> None:
    clock = EmulatorClock(speed=3)
    failures: list[str] = []

    def read() -> None:
        last = 0
        for _ in range(2000):
            now = clock.now_us()
            if now < last:
                failures.append(f"{now} < {last}")
            last = now

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    clock.advance(10)
    for thread in threads:
        thread.join()
    assert failures == []


@pytest.mark.parametrize("speed", [0.5, 0, -1, float("nan")])
def test_bad_speeds_are_refused(speed: float) -> None:
    with pytest.raises(ValueError):
        EmulatorClock(speed=speed)
    with pytest.raises(ValueError):
        EmulatorClock().set_speed(speed)


def test_bad_moves_are_refused() -> None:
    clock = EmulatorClock(START, frozen=True)
    with pytest.raises(ValueError):
        clock.advance(-1)
    with pytest.raises(ValueError):
        clock.set(datetime(2026, 1, 1))  # naive
    assert clock.now_us() == START_US
    assert abs(clock.time() - START.replace(tzinfo=UTC).timestamp()) < 1e-6
