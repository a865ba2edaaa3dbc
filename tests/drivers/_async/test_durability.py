"""``durability="replica"``: track() returns once a replica holds the event."""

from __future__ import annotations

import pytest

from outpost_async import NotDurable, UsageError
from outpost_core import Customer
from outpost_core import _keys as keys
from tests.drivers._async._helpers import COUNT, make
from tests.drivers._async.test_local_state import consumed, prepare
from tests.support.redis_cluster import RedisReplica
from tests.support.redis_server import RedisServer
from tests.support.wiring import shards_of

C1 = Customer("external", "c1")


def _holds_on(server: RedisServer) -> list[str]:
    fields = server.client().hkeys(keys.state_key(C1, "r-count", shards_of(server)))
    names = [f.decode() if isinstance(f, bytes) else f for f in fields]
    return [name for name in names if name.startswith("h:")]


def _events_on(server: RedisServer) -> list[str]:
    client = server.client()
    match = keys.state_key(C1, "r-count", shards_of(server)) + ":ev:*"
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
        # An id track() made up is in the error, for the retry.
        with pytest.raises(NotDurable) as raised:
            await a.track("api_call", external_customer_id="c1")
        made_up = raised.value.event_id
        assert made_up is not None and made_up in str(raised.value)
        with pytest.raises(NotDurable):
            await a.track("api_call", external_customer_id="c1", event_id=made_up)
        assert await consumed(a, COUNT, "c1") == 3


def test_a_durability_that_does_not_exist_is_refused_at_once(redis_server: RedisServer) -> None:
    with pytest.raises(UsageError):
        make(redis_server, durability="disk")


@pytest.mark.anyio
async def test_admission_waits_for_the_replica_too(
    redis_server: RedisServer, redis_replica: RedisReplica
) -> None:
    prepare(redis_server, C1)
    async with make(redis_server, durability="replica", durability_timeout=10.0) as a:
        reservation = await a.reserve(COUNT, 1, external_customer_id="c1")
        # No waiting here: WAIT made sure before reserve() returned.
        assert _holds_on(redis_replica)
        committed = await reservation.commit("api_call")
        assert [f for f in _events_on(redis_replica) if f.endswith(committed)]
        assert not _holds_on(redis_replica)
        admitted = await a.track("api_call", external_customer_id="c1", require_balance=True)
        assert [f for f in _events_on(redis_replica) if f.endswith(admitted)]
    redis_replica.kill()
    async with make(redis_server, durability="replica", durability_timeout=0.1) as a:
        with pytest.raises(NotDurable) as raised:
            await a.reserve(COUNT, 1, external_customer_id="c1")
        assert raised.value.event_id is None  # a hold: no event to retry
        with pytest.raises(NotDurable) as raised:
            await a.track("api_call", external_customer_id="c1", require_balance=True)
        assert raised.value.event_id is not None and raised.value.event_id in str(raised.value)
