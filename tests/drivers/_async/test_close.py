"""Shutdown is bounded: with Polar, and so the telemetry relay, down, close()
returns within its timeout, and the last telemetry export fails quietly (one DEBUG line). Both
drivers. The bound is on a behaviour (an exporter retrying for 20 s at exit, a flush waiting 10 s
for Polar), with a margin a loaded machine cannot use up, not a performance figure."""

from __future__ import annotations

import logging
import time

import pytest

from outpost_async import AsyncOutpost
from outpost_core import _keys
from outpost_emulator import Emulator
from tests.conftest import Otel
from tests.drivers._async._helpers import CONFIGURATION, connect, count_meter, eventually
from tests.support import polar
from tests.support.redis_server import RedisServer
from tests.support.silent_server import SilentServer

MARGIN = 5.0  # far below the 10-20 s that waiting on what is down would take


@pytest.mark.anyio
@pytest.mark.parametrize("timeout", [1.0, 2.0])
async def test_close_returns_within_its_timeout_when_polar_is_down(
    redis_server: RedisServer,
    emulator: Emulator,
    otel: Otel,
    caplog: pytest.LogCaptureFixture,
    timeout: float,
) -> None:
    meter = count_meter(emulator)
    a = connect(redis_server, emulator, telemetry=True, telemetry_interval=0.2)
    await a.balance(meter, external_customer_id="c1")

    async def exporting() -> bool:
        return bool(emulator.telemetry()["metrics"])

    await eventually(exporting, what="the relay receiving an export")
    emulator.stop()
    for _ in range(3):  # undeliverable now: the flush in close() waits for them in vain
        await a.track("api_call", external_customer_id="c1")
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        started = time.monotonic()
        await a.close(timeout)
        took = time.monotonic() - started
    assert took < timeout + MARGIN, f"close({timeout}) took {took:.2f} s"
    from_opentelemetry = [r for r in caplog.records if r.name.startswith("opentelemetry")]
    assert from_opentelemetry == []
    at_close = [r for r in caplog.records if "last export failed at close" in r.getMessage()]
    assert len(at_close) == 1 and at_close[0].levelno == logging.DEBUG
    assert not [r for r in caplog.records if r.exc_info]  # no stack trace anywhere
    queued = sum(redis_server.client().xlen(stream) for stream in _keys.all_outboxes())
    assert queued == 3  # what Polar did not take stays in Redis for the next instance


@pytest.mark.anyio
async def test_close_returns_within_its_timeout_when_polar_never_answers(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The WebSocket's upgrade and an ingestion request both hang, unanswered."""
    polar.store_configuration(redis_server.client(), CONFIGURATION)
    with SilentServer() as silent:
        a = AsyncOutpost(
            access_token="token",
            server_url=silent.url,
            redis_url=redis_server.url,
            telemetry=False,
            linger=0.01,
        )
        await a.track("api_call", external_customer_id="c1")

        async def both_waiting() -> bool:
            return len(silent.accepted) >= 2

        await eventually(both_waiting, what="the WebSocket and a delivery waiting on Polar")
        started = time.monotonic()
        await a.close(1.0)
        took = time.monotonic() - started
    assert took < 1.0 + MARGIN, f"close(1.0) took {took:.2f} s"
    assert not [r for r in caplog.records if r.exc_info]
