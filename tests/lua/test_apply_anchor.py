"""apply_anchor.lua against a real Redis, with its arguments built by the core
(``outpost_core._public_anchoring``) from what the test reads back, as a driver does."""

from __future__ import annotations

import json

import redis

from outpost_core import Customer
from outpost_core._keys import shard_of
from outpost_core._public_anchoring import anchor
from outpost_core._public_ledger import Outcome
from outpost_core._public_readings import PolarReading
from tests.lua._scripts import (
    BUCKET,
    CHANNEL,
    B,
    Channel,
    Scripts,
    absolute,
    acked_key,
    changes,
    field,
    state_key,
)

METER = "m-1"
MARGIN = 10_000_000
SEC = 1_000_000


def reading(consumed: float, credited: int, modified_at: int | None) -> PolarReading:
    return PolarReading("c1", None, METER, consumed, credited, credited - consumed, modified_at)


def apply(
    scripts: Scripts, polar: PolarReading, *, known: int = -1, aggregation: str = "sum"
) -> tuple[str | None, Outcome]:
    """Read the state and the events, let the core decide, run the script; (reply, outcome)."""
    fields = scripts.hash(state_key(METER))
    events = scripts.events(METER)
    decided = anchor(aggregation, MARGIN, fields, events, polar)
    if decided.write is None:
        return None, decided.outcome
    args = decided.write.args(CHANNEL, absolute(state_key(METER), known))
    keys = [state_key(METER), acked_key(METER)]
    return scripts.run("apply_anchor", keys, list(args)), decided.outcome


def test_first_anchor_of_a_new_identity(scripts: Scripts, channel: Channel) -> None:
    reply, outcome = apply(scripts, reading(0, 100, None))
    assert outcome.value == "no_watermark"
    state = scripts.state(METER)
    assert state["c:m-1"] == "100" and state["p"] == "0 0 - -"
    assert state["cu"] == "0" and state["sa"] == "0" and state["sid"] == "public"
    assert state["n"] == "0" and state["u"] == "0" and state["rev"] == "1"
    assert json.loads(state["pub"])["a"] == [0, 100, 100, None]
    assert reply is not None and changes(reply) == [{"k": state_key(METER), "r": 1}]
    (message,) = channel.published()
    assert changes(message)[0]["r"] == 1
    scripts.check(METER)
    scripts.check_ttls(METER)


def test_prunes_what_the_figure_includes_and_keeps_the_rest(
    scripts: Scripts, channel: Channel
) -> None:
    scripts.track("e1", {METER: 5})
    scripts.track("e2", {METER: 3})
    scripts.track("e3", {METER: 4}, bucket=BUCKET + B)
    e1, e2, e3 = field(BUCKET, "e1"), field(BUCKET, "e2"), field(BUCKET + B, "e3")
    scripts.settle("acknowledge", {METER: [e1, e2]}, now=BUCKET + 10 * SEC)
    scripts.settle("acknowledge", {METER: [e3]}, now=BUCKET + 100 * SEC)
    channel.published()
    # Polar's figure stamped 30 s after e1 and e2 were acknowledged, with the margin 10 s:
    # they are before the watermark and the consumed covers them; e3 is after it.
    _, outcome = apply(scripts, reading(8, 50, BUCKET + 30 * SEC), known=scripts.rev(METER))
    assert outcome.value == "first"
    assert scripts.events(METER) == {e3: f"4 {BUCKET + 100 * SEC}"}
    state = scripts.state(METER)
    assert f"a:{BUCKET}" not in state and state[f"a:{BUCKET + B}"] == "1 4 4 4"
    assert state["p"] == "1 8 8 8" and state["c:m-1"] == "50"
    assert state["n"] == "1" and state["u"] == "0"
    scripts.check(METER)
    scripts.check_ttls(METER)
    (message,) = channel.published()
    change = changes(message)[0]
    assert f"a:{BUCKET}" in change["d"]
    # The local consumed: Polar's 8 and the pending 4, 50 credited: 38 = Polar's 42 less 4.


def test_a_check_that_fails_anchors_and_prunes_nothing(scripts: Scripts) -> None:
    scripts.track("e1", {METER: 5})
    scripts.settle("acknowledge", {METER: [field(BUCKET, "e1")]}, now=BUCKET + SEC)
    _, outcome = apply(scripts, reading(2, 10, BUCKET + 60 * SEC))  # consumed 2 < 5: rejected
    assert outcome.value == "rejected"
    assert scripts.events(METER) == {field(BUCKET, "e1"): f"5 {BUCKET + SEC}"}
    state = scripts.state(METER)
    assert state["p"] == "1 2 2 2" and json.loads(state["pub"])["r"] == 1
    scripts.check(METER)


def test_a_stale_figure_writes_nothing(scripts: Scripts) -> None:
    apply(scripts, reading(1, 10, BUCKET + 60 * SEC))
    before = scripts.dump()
    reply, outcome = apply(scripts, reading(0, 10, BUCKET + 30 * SEC))
    assert reply is None and outcome.value == "stale"
    assert scripts.dump() == before


def test_a_revision_that_moved_is_a_conflict_and_writes_nothing(
    scripts: Scripts, client: redis.Redis, channel: Channel
) -> None:
    scripts.track("e1", {METER: 5})
    fields = scripts.hash(state_key(METER))
    events = scripts.events(METER)
    decided = anchor("sum", MARGIN, fields, events, reading(0, 10, BUCKET + SEC))
    scripts.track("e2", {METER: 1})  # a track lands between the read and the script
    channel.published()
    before = scripts.dump()
    assert decided.write is not None
    keys = [state_key(METER), acked_key(METER)]
    reply = scripts.run("apply_anchor", keys, list(decided.write.args(CHANNEL, -1)))
    rev = scripts.hash(state_key(METER))["rev"]
    assert json.loads(reply) == {"conflict": rev}
    assert scripts.dump() == before
    assert channel.published() == []


def test_a_hash_that_appeared_is_a_conflict(scripts: Scripts) -> None:
    decided = anchor("sum", MARGIN, {}, {}, reading(0, 10, None))
    scripts.track("e1", {METER: 5})
    assert decided.write is not None
    keys = [state_key(METER), acked_key(METER)]
    reply = scripts.run("apply_anchor", keys, list(decided.write.args(CHANNEL, -1)))
    assert "conflict" in json.loads(reply)
    assert "pub" not in scripts.state(METER)


def test_undelivered_events_removed_move_u(scripts: Scripts) -> None:
    """An event pruned before its acknowledgement reached Redis (another instance's figure
    cannot prune it: it has no ack time; a caller could): u follows what was removed."""
    scripts.track("e1", {METER: 5})
    decided = anchor("sum", MARGIN, scripts.hash(state_key(METER)), {}, reading(0, 10, None))
    assert decided.write is not None
    write = decided.write
    forced = type(write)(
        write.expected_rev,
        write.meter_id,
        write.credited,
        write.polar,
        write.as_of,
        write.pub,
        (field(BUCKET, "e1"),),
    )
    keys = [state_key(METER), acked_key(METER)]
    scripts.run("apply_anchor", keys, list(forced.args(CHANNEL, -1)))
    state = scripts.state(METER)
    assert state["n"] == "0" and state["u"] == "0" and f"a:{BUCKET}" not in state
    scripts.check(METER)


def test_customer_of_the_tests_is_the_one_of_the_keys() -> None:
    assert state_key(METER).startswith(f"outpost:v2:{{{shard_of(Customer('external', 'c1'))}}}:")
