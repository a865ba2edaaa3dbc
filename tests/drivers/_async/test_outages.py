"""Redis down under a live instance: every loop backs off, each says so once, and
everything resumes when Redis is back, without a restart."""

from __future__ import annotations

import logging
import time

import pytest

from outpost_async import RedisUnavailable
from outpost_async._backend import sleep
from outpost_emulator import Emulator
from tests.drivers._async._helpers import connect, count_meter, eventually
from tests.support.redis_server import RedisServer
from tests.support.refusing_port import RefusingPort

OUTAGE = 20.0  # seconds, as the issue measured it


@pytest.mark.slow
@pytest.mark.anyio
async def test_redis_down_for_twenty_seconds_backs_off_says_so_once_then_resumes(
    durable_redis_server: RedisServer, emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    server = durable_redis_server
    meter = count_meter(emulator)
    emulator.grant_credits(meter, 100, external_customer_id="c1")
    async with connect(server, emulator) as a:
        await a.track("api_call", external_customer_id="c1")
        assert (await a.balance(meter, external_customer_id="c1")).consumed == 1
        assert await a.flush(10)
        with caplog.at_level(logging.INFO, logger="outpost"):
            server.stop()
            with RefusingPort(server.port) as dark:
                with pytest.raises(RedisUnavailable):
                    await a.track("api_call", external_customer_id="c1")
                # Polar pushes a snapshot: the flow cannot list from Redis, and must back off
                # rather than ask Polar again at once (11,713 log lines in 10 s before).
                emulator.grant_credits(meter, 5, external_customer_id="c1")
                end = time.monotonic() + OUTAGE
                while time.monotonic() < end:  # the outage itself is what is measured
                    await sleep(0.1)
                attempts = dark.connections
                assert a.status.redis_error is not None
            down = [r for r in caplog.records if r.levelno >= logging.WARNING]
            # One WARNING per loop that met the outage (state, subscription, delivery), no
            # reminder within a minute; a few more from what the test itself called.
            assert 1 <= len(down) <= 8, [r.getMessage() for r in down]
            # Backoff up to 5 s per loop: a few dozen attempts, not thousands.
            assert attempts <= 150, attempts
            server.start()

            async def resumed() -> bool:
                try:
                    await a.track("api_call", external_customer_id="c1")
                except RedisUnavailable:
                    return False
                return True

            await eventually(resumed, timeout=20, what="track() working again")

            async def read_again() -> bool:
                found = await a.balance(meter, external_customer_id="c1")
                return found.credited == 105 and found.consumed == 2 and found.source == "memory"

            await eventually(read_again, timeout=20, what="reads exact and warm again")
            assert await a.flush(20)
            assert emulator.customer_meter(meter, external_customer_id="c1")["consumed_units"] == 2
            back = [
                r for r in caplog.records if r.levelno == logging.INFO and "back" in r.getMessage()
            ]
            assert back, "no INFO line saying Redis is back"
