"""A sync instance left open closes itself, and so delivers, when the interpreter exits."""

from __future__ import annotations

from outpost_emulator import Emulator
from tests.drivers._sync._helpers import count_meter
from tests.drivers._sync.test_metering import counters
from tests.support.redis_server import RedisServer
from tests.support.track_and_exit import track_then_exit


def test_an_instance_left_open_delivers_its_events_at_exit(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    count_meter(emulator)
    said = track_then_exit(redis_server.url, emulator.url, emulator.token, 300)
    assert said == "tracked 300\n"
    seen = counters(emulator)  # the child has exited: whatever it delivered is in already
    assert (seen["events"], seen["events_duplicate"]) == (300, 0)
