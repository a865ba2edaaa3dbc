"""``durability="replica"``: track() returns once a replica holds the event (issue 16)."""

from __future__ import annotations

import pytest

from outpost_async import NotDurable, UsageError
from outpost_core import Customer
from outpost_core import _keys as keys
from tests.drivers._async._helpers import COUNT, make
from tests.drivers._async.test_local_state import consumed, prepare
from tests.support.redis_server import RedisReplica, RedisServer

C1 = Customer("external", "c1")


def _events_on(server: RedisServer) -> list[str]:
    client = server.client()
    match = keys.state_key(C1, "r-count") + ":ev:*"
    fields = [f for key in client.scan_iter(match=match) for f in client.hkeys(key)]
    return [f.decode() if isinstance(f, bytes) else f for f in fields]


@pytest.mark.anyio
async def test_a_returned_track_is_on_the_replica_and_a_missing_replica_raises_not_durable(
    redis_server: RedisServer, redis_replica: RedisReplica
) -> None:
    prepare(redis_server, C1)
    async with make(redis_server, durability="replica", durability_timeout=10.0) as a:
        first = await a.track("api_call", external_customer_id="c1")
        # No waiting here: WAIT made sure before track() returned.
        assert [f for f in _events_on(redis_replica) if f.endswith(first)]
    redis_replica.kill()
    async with make(redis_server, durability="replica", durability_timeout=0.1) as a:
        with pytest.raises(NotDurable, match="0 of 1 replica"):
            await a.track("api_call", external_customer_id="c1", event_id="second")
        # Written on the primary all the same: it counts, and a retry writes nothing twice.
        assert await consumed(a, COUNT, "c1") == 2
        with pytest.raises(NotDurable):
            await a.track("api_call", external_customer_id="c1", event_id="second")
        assert await consumed(a, COUNT, "c1") == 2


def test_a_durability_that_does_not_exist_is_refused_at_once(redis_server: RedisServer) -> None:
    with pytest.raises(UsageError):
        make(redis_server, durability="disk")
