"""An entry delivered and never settled, as a settlement Redis acknowledged and then lost (a
primary that failed before replicating it) leaves it: pending for the instance's consumer."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis

from outpost_async import AsyncOutpost
from outpost_core import _keys as keys
from outpost_core._delivery import GROUP
from outpost_emulator import Emulator
from tests.drivers._async._helpers import connect, make
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_server import RedisServer
from tests.support.wiring import shards_of


@asynccontextmanager
async def settlement_lost(
    server: RedisServer | RedisCluster, emulator: Emulator, meter: str, customer: str = "c1"
) -> AsyncIterator[AsyncOutpost]:
    """An instance (``claim_idle`` the default 300 s) whose consumer was delivered the one event
    tracked for ``customer``, and never settled it; it has started (it read the customer)."""
    async with connect(server, emulator) as first:  # caches Polar's configuration in Redis
        await first.balance(meter, external_customer_id=customer)
    writer = make(server)  # no token: its event stays in the outbox for the others
    a = connect(server, emulator)
    try:
        await writer.track("api_call", external_customer_id=customer)
        client: Any = server.client()
        delivered = 0
        for stream in keys.all_outboxes(shards_of(server)):  # one by one: a cluster's slots differ
            with contextlib.suppress(redis.ResponseError):
                client.xgroup_create(stream, GROUP, id="0", mkstream=True)
            for _, entries in client.xreadgroup(GROUP, a._context.consumer, {stream: ">"}):
                delivered += len(entries)
        assert delivered == 1
        assert (await a.balance(meter, external_customer_id=customer)).consumed == 1  # a starts
        yield a
    finally:
        await a.close()
        await writer.close()
