"""Exact admission across processes: 8 processes of 25 threads (or tasks) each ask for one unit of
a customer whose balance is 100, all at once. Exactly 100 are admitted, the others refused, and
Polar (the emulator) counts exactly 100 once delivered. A process killed while it holds units
strands nothing: they come back at the hold's expiry, and nothing of them reaches Polar."""

from __future__ import annotations

import signal
import subprocess

import pytest

from outpost_core import InsufficientBalance
from outpost_emulator import Emulator
from tests.drivers._sync._helpers import connect, count_meter
from tests.support import admit_child
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

PROCESSES = 8
WORKERS = 25


def _finish(children: list[subprocess.Popen[bytes]]) -> list[str]:
    lines = []
    for child in children:
        out, _ = child.communicate(timeout=120)
        lines.append(out.decode().strip().splitlines()[-1])
    return lines


@pytest.mark.parametrize("mode", ["reserve", "track", "async-reserve", "async-track"])
def test_processes_admit_exactly_the_balance(
    redis_server: RedisServer, emulator: Emulator, mode: str
) -> None:
    meter = count_meter(emulator, credits=100)
    children = [
        admit_child.start(redis_server.url, emulator.url, emulator.token, meter, mode, WORKERS)
        for _ in range(PROCESSES)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().decode().strip() == "ready"
        for child in children:  # every process warm, then all of them at once
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            child.stdin.flush()
        lines = _finish(children)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    admitted = refused = 0
    for line in lines:
        words = line.split()
        assert words[0::2] == ["admitted", "refused"], line
        admitted += int(words[1])
        refused += int(words[3])
    assert (admitted, refused) == (100, PROCESSES * WORKERS - 100)
    assert emulator.customer_meter(meter, external_customer_id="c1")["consumed_units"] == 100
    assert emulator.state()["events"]["count"] == 100


def test_a_killed_process_strands_nothing(redis_server: RedisServer, emulator: Emulator) -> None:
    meter = count_meter(emulator, credits=10)
    child = admit_child.start(redis_server.url, emulator.url, emulator.token, meter, "hold", 10)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().decode().strip() == "held"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
        if child.stdin is not None:
            child.stdin.close()
    with connect(redis_server, emulator) as other:
        # The dead process's hold counts until it expires, then its units are free again.
        def reserved() -> bool:
            try:
                other.reserve(meter, 10, external_customer_id="c1").release()
            except InsufficientBalance:
                return False
            return True

        wait_until(reserved, timeout=20, what="the killed process's 10 units free again")
        assert other.flush(10)
    assert emulator.state()["events"]["count"] == 0
    assert emulator.customer_meter(meter, external_customer_id="c1")["consumed_units"] == 0
