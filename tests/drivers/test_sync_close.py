"""A sync instance's close() ends every thread it started without waiting out their polls: a
script that tracks one event and exits pays for the flush, not for a quarter of a second of
each worker's wait (which 100 short-lived instances in a row paid 100 times)."""

from __future__ import annotations

import threading

import pytest

import outpost_sync._effects
import outpost_sync._subscriber
from outpost_emulator import Emulator
from tests.drivers._sync._helpers import connect, count_meter, on_redis_and_cluster
from tests.support.redis_server import RedisServer

redis_server = on_redis_and_cluster

LONG_POLL = 60.0  # far longer than close() is given: a worker that waits it out is left behind


def test_close_ends_every_worker_rather_than_wait_out_its_poll(
    redis_server: RedisServer, emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outpost_sync._subscriber, "POLL", LONG_POLL)
    monkeypatch.setattr(outpost_sync._effects, "POLL", LONG_POLL)
    count_meter(emulator)
    before = set(threading.enumerate())
    instance = connect(redis_server, emulator)
    instance.track("api_call", external_customer_id="c1")
    started = [t for t in threading.enumerate() if t not in before]
    assert {"outpost-subscriber", "outpost-effects"} <= {t.name for t in started}
    instance.close(timeout=5)
    assert [t.name for t in started if t.is_alive()] == []
