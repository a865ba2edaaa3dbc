"""The public-API mode's resets, both drivers, against real Redis and the emulator serving only
Polar's public API: a cycle whose own figure was lost is still a new window when the next
figure's webhook says when the period began, though consumed did not fall."""

from __future__ import annotations

import pytest

from outpost_emulator import Emulator
from tests.drivers._async._helpers import eventually, holds
from tests.drivers._async.test_public_mode import by_webhook, calls_meter, public, pump, truth
from tests.support.redis_server import RedisServer
from tests.support.webhook_receiver import Receiver


@pytest.mark.anyio
async def test_a_cycle_the_webhook_reports_starts_a_window_though_consumed_did_not_fall(
    redis_server: RedisServer, public_emulator: Emulator, receiver: Receiver
) -> None:
    meter = calls_meter(public_emulator, 100)
    # Polls a minute apart: the figures come by webhook.
    instance = public(redis_server, public_emulator, **by_webhook(public_emulator, receiver))
    taken = [0]
    async with instance:

        async def reads(balance: float, pending: int = 0) -> bool:
            await pump(receiver, taken, instance)
            read = await instance.balance(meter, external_customer_id="c1")
            return read.balance == balance and read.pending == pending

        assert await reads(100)
        for _ in range(3):
            await instance.track("api_call", external_customer_id="c1")
        assert await instance.flush()
        await eventually(lambda: reads(97), timeout=20.0, what="the old window's figure")
        public_emulator.fault_webhook_drop(count=1)
        public_emulator.cycle(meter, 50, external_customer_id="c1")  # its figure is lost

        def dropped() -> bool:
            deliveries = public_emulator.webhooks()["deliveries"]
            return any(d["outcome"] == "dropped" for d in deliveries)

        await eventually(holds(dropped), what="the cycle's webhook lost")
        for _ in range(5):  # the new window uses more than the old one had (3)
            await instance.track("api_call", external_customer_id="c1")
        assert await instance.flush()
        # The next figure (consumed 5, not below 3) says the period began at the cycle: a new
        # window, checked from nothing, so its five events leave the ledger.
        await eventually(lambda: reads(45), timeout=20.0, what="the new window's balance")
        assert truth(public_emulator, meter) == 45
        assert instance._public.anchors.outcomes["reset"] == 1
