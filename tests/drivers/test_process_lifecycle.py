"""A sync instance across its process's life: left open at exit, inherited by a forked child."""

from __future__ import annotations

from outpost_emulator import Emulator
from tests.drivers._sync._helpers import count_meter
from tests.drivers._sync.test_metering import counters
from tests.support.redis_server import RedisServer
from tests.support.track_after_fork import run_forking
from tests.support.track_and_exit import track_then_exit


def test_an_instance_left_open_delivers_its_events_at_exit(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    count_meter(emulator)
    said = track_then_exit(redis_server.url, emulator.url, emulator.token, 300)
    assert said == "tracked 300\n"
    seen = counters(emulator)  # the child has exited: whatever it delivered is in already
    assert (seen["events"], seen["events_duplicate"]) == (300, 0)


def test_a_forked_child_starts_the_inherited_instance_afresh(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = count_meter(emulator)
    said = run_forking(redis_server.url, emulator.url, emulator.token, meter, 50)
    assert said.splitlines() == ["parent tracked 1", "child followed True flushed True"]
    seen = counters(emulator)
    assert (seen["events"], seen["events_duplicate"]) == (52, 0)
