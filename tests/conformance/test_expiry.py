"""An identity idle for eight days expires from Redis while instances keep following it.

Both hashes of an identity expire eight days after their last write (lib.lua ``TTL``). The next
write creates them again from revision 1, but an instance that followed the identity holds a copy
at a higher revision: its mirror ignores every change (and every whole-state reply, snapshot
applications included) whose revision is not above the one it holds. Until enough writes pass the
old revision, or the instance reloads, its reads show the state from before the expiry: Polar's
old totals without the events tracked since. The local balance is then higher than Polar's.

This runs the scenario in the model test's machine, with the expiry done by hand (the TTL is in
Redis's real clock); it is expected to fail until revisions survive an expiry (see the
conformance report).
"""

from __future__ import annotations

from outpost_core import SCRIPT_TEXT
from outpost_core import _keys as keys
from tests.conformance.test_model import REDUCERS, machine_for
from tests.support.redis_server import RedisServer


def test_a_copy_follows_an_identity_recreated_after_it_expired(
    redis_server: RedisServer,
) -> None:
    with machine_for(redis_server, SCRIPT_TEXT, quiesce_at_teardown=False) as machine:
        state = machine()
        for _ in range(3):
            state.track(customer="c1", tokens=1.0, lag=0, bad=False, again=None)
        state.deliver(outcome="accept", hold=False)
        state.advance(minutes=6, sync="on_time")
        state.push(state.polar.snapshot("c1", None))  # Polar counts the three events
        state.connections(to_a=True, how="all")
        before = state.a.read("m-count", "c1")
        assert (before.consumed, before.pending, before.polar.count) == (3, 0, 3)

        # Eight days without a write for c1: Redis drops every key of each identity.
        for reducer in REDUCERS:
            key = keys.state_key(keys.Customer("external", "c1"), reducer.id)
            state.client.delete(key, *state.client.scan_iter(match=f"{key}:*"))
        state.track(customer="c1", tokens=1.0, lag=0, bad=False, again=None)
        state.push(state.polar.snapshot("c1", None))  # and Polar's totals come back
        state.connections(to_a=True, how="all")

        after = state.a.read("m-count", "c1")
        assert after.consumed == 4, f"instance A still reads the state before the expiry: {after}"
