"""The public-API mode's quantities probes, both drivers, against real Redis and the emulator
serving only Polar's public API: a customer meter at the band is probed, and what the probe
proves leaves the ledger while Polar's own customer meter is not recomputed yet."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from outpost_emulator import Emulator
from tests.drivers._async._helpers import eventually
from tests.drivers._async.test_public_mode import calls_meter, public, reported, truth
from tests.support.redis_server import RedisServer


@pytest.fixture
def quiet_emulator() -> Iterator[Emulator]:
    """Polar recomputes an hour after the last ingest: only a probe tells what it counts."""
    with Emulator.start(port=0, public_only=True, recompute_delays=(3600.0, 7200.0)) as emu:
        yield emu


@pytest.mark.anyio
async def test_a_balance_at_the_band_is_probed_and_what_the_probe_counts_leaves_the_ledger(
    redis_server: RedisServer, quiet_emulator: Emulator
) -> None:
    meter = calls_meter(quiet_emulator, 3)
    async with public(redis_server, quiet_emulator, poll_interval=60.0) as instance:
        assert (await instance.balance(meter, external_customer_id="c1")).balance == 3
        for _ in range(2):
            await instance.track("api_call", external_customer_id="c1")
        assert await instance.flush()
        quiet_emulator.clock.advance(30)  # both acknowledged well before the replica's lag
        await instance.track("api_call", external_customer_id="c1")  # the balance reaches 0
        outcomes = instance._public.anchors.outcomes

        async def probed() -> bool:
            read = await instance.balance(meter, external_customer_id="c1")
            return outcomes["probed"] >= 1 and read.pending == 1

        await eventually(probed, what="the probe dropping the two events it counts")
        read = await instance.balance(meter, external_customer_id="c1")
        assert read.credited == 3 and read.balance <= truth(quiet_emulator, meter) == 0
        assert reported(quiet_emulator, meter) == 3  # Polar's customer meter: not recomputed
        assert quiet_emulator.state()["counters"]["http_quantities"] >= 1
        assert instance.rejections.get("public", 0) == 0
