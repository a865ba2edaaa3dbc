"""The public-API mode, both drivers, against real Redis and the emulator serving only Polar's
public API: which balances are approximate (avg and min meters relay Polar's figure), and
customers named only by Polar's customer id, polled by it."""

from __future__ import annotations

import pytest

from outpost_emulator import Emulator
from tests.drivers._async._helpers import CALLS_FILTER, eventually
from tests.drivers._async.test_public_mode import public
from tests.support.redis_server import RedisServer


@pytest.mark.anyio
@pytest.mark.parametrize(("func", "approximate"), [("avg", True), ("min", True), ("sum", False)])
async def test_avg_and_min_balances_are_polars_figure_marked_approximate(
    redis_server: RedisServer, public_emulator: Emulator, func: str, approximate: bool
) -> None:
    meter = str(
        public_emulator.create_meter("latency", CALLS_FILTER, {"func": func, "property": "ms"})[
            "id"
        ]
    )
    public_emulator.create_customer("c1")
    public_emulator.grant_credits(meter, 100, external_customer_id="c1")
    async with public(redis_server, public_emulator) as instance:
        first = await instance.balance(meter, external_customer_id="c1")
        assert (first.credited, first.approximate) == (100, approximate)
        await instance.track("api_call", external_customer_id="c1", metadata={"ms": 7})
        again = await instance.balance(meter, external_customer_id="c1", fresh=True)
        assert again.approximate == approximate and again.source == "redis"


@pytest.mark.anyio
async def test_a_customer_named_by_polars_id_is_polled_by_customer_id(
    redis_server: RedisServer, public_emulator: Emulator
) -> None:
    meter = str(public_emulator.create_meter("calls", CALLS_FILTER, {"func": "count"})["id"])
    uid = str(public_emulator.create_customer()["id"])
    public_emulator.grant_credits(meter, 10, customer_id=uid)
    async with public(redis_server, public_emulator) as instance:
        first = await instance.balance(meter, customer_id=uid)  # no webhook: a poll answers
        assert (first.credited, first.balance) == (10, 10)
        for _ in range(3):
            await instance.track("api_call", customer_id=uid)
        assert (await instance.balance(meter, customer_id=uid)).balance == 7
        assert await instance.flush()

        async def settled() -> bool:
            read = await instance.balance(meter, customer_id=uid)
            return read.balance == 7 and read.pending == 0  # Polar's figure, by the polls

        await eventually(settled, timeout=20.0, what="the polls bringing Polar's figure")
        nobody = "00000000-0000-4000-8000-000000000000"  # no such customer: no row
        assert (await instance.balance(meter, customer_id=nobody)).credited == 0
