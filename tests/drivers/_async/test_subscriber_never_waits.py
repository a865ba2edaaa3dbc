"""The change subscription only reads and applies: what its news asks for (loads of the copies,
listings of pending events, snapshot scripts) runs on the effects worker, and a snapshot's flow on
the link loop, so a change message never waits behind a slow load or listing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from outpost_async import AsyncOutpost
from outpost_core import Customer
from outpost_core import _keys as keys
from outpost_emulator import Emulator
from tests.drivers._async._helpers import (
    COUNT,
    connect,
    credited,
    eventually,
    holds,
    make,
    metered,
)
from tests.drivers._async.test_local_state import consumed, prepare
from tests.support.redis_server import RedisServer


class Gate:
    """Holds the calls it is asked to hold until released: a Redis slow for those alone."""

    def __init__(self) -> None:
        self.held = 0
        self.released = False

    async def hold(self) -> None:
        self.held += 1
        await eventually(holds(lambda: self.released), timeout=60, what="the gate released")


def follows_one_track(instance: AsyncOutpost, meter: str) -> Callable[[], Awaitable[bool]]:
    """A check: the instance's copy of c1 answers from memory and counts the one event."""

    async def check() -> bool:
        balance = await instance.balance(meter, external_customer_id="c1")
        return balance.source == "memory" and balance.consumed == 1

    return check


@pytest.mark.anyio
async def test_a_copy_follows_changes_while_another_copys_load_is_slow(
    redis_server: RedisServer,
) -> None:
    c1, c2 = Customer("external", "c1"), Customer("external", "c2")
    prepare(redis_server, c1, c2)
    async with make(redis_server) as a, make(redis_server) as b:
        assert await consumed(a, COUNT, "c2") == 0  # c2's copy first, then c1's
        assert await consumed(a, COUNT, "c1") == 0
        await eventually(holds(lambda: a.subscribed), what="a subscribed")
        gate, slow_key = Gate(), keys.state_key(c2, "r-count")
        execute = a._context.batches.execute

        async def slow_for_c2(*command: Any, **options: Any) -> Any:
            if command[:2] == ("HGETALL", slow_key) and not gate.released:
                await gate.hold()
            return await execute(*command, **options)

        a._context.batches.execute = slow_for_c2  # type: ignore[method-assign]
        try:
            # A new subscription reloads the copies read recently, the most recent first: c1's,
            # then c2's, which hangs.
            redis_server.client().client_kill_filter(_type="pubsub")
            await eventually(holds(lambda: gate.held > 0), what="a reloading c2's copy")
            await b.track("api_call", external_customer_id="c1")
            await eventually(follows_one_track(a, COUNT), what="a's copy of c1 following b")
        finally:
            gate.released = True
        assert await consumed(a, COUNT, "c2") == 0


@pytest.mark.anyio
async def test_a_copy_follows_changes_while_a_snapshots_listing_is_slow(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    # a follows c1, its first snapshot applied
    async with (
        metered(redis_server, emulator, credits=10, warm=True) as (meter, a),
        connect(redis_server, emulator) as b,
    ):
        gate = Gate()
        execute_all = a._context.batches.execute_all

        async def slow_listings(*commands: tuple[Any, ...]) -> list[Any]:
            if commands and commands[0][0] == "HKEYS" and not gate.released:
                await gate.hold()
            return await execute_all(*commands)

        a._context.batches.execute_all = slow_listings  # type: ignore[method-assign]
        try:
            emulator.grant_credits(meter, 5, external_customer_id="c1")  # pushes a snapshot
            await eventually(holds(lambda: gate.held > 0), what="the new snapshot's listing")
            await b.track("api_call", external_customer_id="c1")
            await eventually(follows_one_track(a, meter), what="a's copy of c1 following b")
        finally:
            gate.released = True

        async def snapshot_applied() -> bool:
            return await credited(a, meter, "c1") == 15

        await eventually(snapshot_applied, what="the held snapshot applied once released")
