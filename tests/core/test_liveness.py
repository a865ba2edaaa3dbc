"""Heartbeats, surveys and hand-back (``_liveness``) and how a delivery loop runs them."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest

from outpost_core import UsageError
from outpost_core import _keys as keys
from outpost_core._delivery import (
    _ANSWERS,
    BatchAnswered,
    ClaimStale,
    DeliveryEffect,
    DeliverySettings,
    Done,
    OutboxRead,
    PostBatch,
    Sleep,
    nothing_done,
)
from outpost_core._liveness import (
    Beat,
    CheckHeartbeats,
    ConsumersListed,
    ForgetHeartbeat,
    HeartbeatsChecked,
    Reclaim,
    Reclaimed,
    SurveyConsumers,
    consumers_of,
    hand_back,
    reclaims,
    taken_entries,
)
from tests.core.test_delivery import BUCKET, OTHER, ST1, STREAM, Loop, entries, item

ME = "host:1:aaaa"
DEAD = "host:2:bbbb"
LIVE = "host:3:cccc"


def listing(*per_stream: tuple[str, list[str]]) -> ConsumersListed:
    return ConsumersListed(
        [(stream, [{"name": n.encode(), "pending": 1, "idle": 5} for n in names])
         for stream, names in per_stream]
    )  # fmt: skip


def entry_reply(*ids: str, stream: str = STREAM) -> Reclaimed:
    taken = [
        [f"1-{i}", ["e", json.dumps(item(i)), "f", f"{BUCKET}:{i}", "k", json.dumps([ST1])]]
        for i in ids
    ]
    return Reclaimed(stream, json.dumps({"e": taken, "d": [DEAD]}).encode())


def live(**settings: Any) -> Loop:
    """A delivery loop with heartbeats on: its first question is a beat."""
    return Loop(DeliverySettings(consumer=ME, heartbeat=8.0, **settings), claimed=False)


def test_heartbeat_settings() -> None:
    assert DeliverySettings().heartbeat == 10.0
    assert DeliverySettings().consumer == ""  # liveness is off unless the driver names itself
    with pytest.raises(UsageError, match="heartbeat must be a positive, finite number"):
        DeliverySettings(heartbeat=0)


def test_a_loop_beats_surveys_and_takes_what_dead_instances_hold() -> None:
    loop = live()
    assert loop.step(Done()) == Beat(keys.heartbeat_key(ME), 8000)
    assert loop.step(listing((STREAM, [ME, DEAD, LIVE]), (OTHER, [DEAD]))) == SurveyConsumers()
    check = loop.step(HeartbeatsChecked([None, b"1"]))
    assert check == CheckHeartbeats((keys.heartbeat_key(DEAD), keys.heartbeat_key(LIVE)))
    assert loop.step(entry_reply("a", "b")) == Reclaim(STREAM, ME, 500, (DEAD,))
    assert loop.step(Reclaimed(OTHER, '{"e": {}, "d": {}}')) == Reclaim(OTHER, ME, 500, (DEAD,))
    assert loop.delivery.consumers_removed == 1
    assert isinstance(loop.step(Done()), ClaimStale)
    action = loop.effect()  # the taken entries wait in the buffer
    assert isinstance(action, Sleep)
    loop.report(Done())
    # Two seconds later (a quarter of the heartbeat): beat and survey again, before the batch.
    assert loop.step(Done(), now=2.0) == Beat(keys.heartbeat_key(ME), 8000)
    assert loop.step(listing((STREAM, [ME]))) == SurveyConsumers()  # nobody else: no check
    assert isinstance(loop.effect(), PostBatch)


def test_beats_come_before_a_batch_waiting_for_polar() -> None:
    loop = live(linger=0.0)
    loop.step(Done())  # beat
    loop.step(listing())  # survey: nobody
    loop.step(OutboxRead([]))  # claim stale
    loop.step(OutboxRead(entries("a")))  # read
    assert isinstance(loop.step(BatchAnswered(429, retry_after=60.0)), PostBatch)
    assert isinstance(loop.step(Done(), now=1.0), Sleep)
    assert loop.step(Done(), now=2.0) == Beat(keys.heartbeat_key(ME), 8000)


def test_unreadable_answers_are_counted_not_raised() -> None:
    loop = live()
    loop.step(Done())
    bad = ConsumersListed([(STREAM, [{"name": b"\xff"}, "junk"]), ("nope", [{"name": b"x"}])])
    assert loop.step(bad) == SurveyConsumers()
    assert loop.delivery.rejected_entries == 3
    loop.step(OutboxRead([]))  # claim stale: nobody was seen, so nothing is checked
    loop.step(Done(), now=2.0)  # beat
    loop.step(listing((STREAM, [DEAD])))  # survey
    assert isinstance(loop.step(HeartbeatsChecked([])), CheckHeartbeats)
    assert loop.delivery.rejected_entries == 4  # no answer for DEAD: nothing is taken
    loop.step(Done(), now=4.0)  # the next beat and survey
    loop.step(listing((STREAM, [DEAD])))
    loop.step(HeartbeatsChecked([None]))
    assert loop.step(Reclaimed(STREAM, b"junk")) == Reclaim(STREAM, ME, 500, (DEAD,))
    assert loop.delivery.rejected_entries == 5


def test_reclaims_rejects_an_answer_of_the_wrong_length() -> None:
    assert reclaims({STREAM: {DEAD}}, (DEAD,), [None, None], ME, 10) == ([], 1)
    assert reclaims({STREAM: {DEAD}}, (DEAD,), [b"1"], ME, 10) == ([], 0)


def test_consumers_of() -> None:
    got, rejected = consumers_of([(STREAM, {"name": "solo"}), (OTHER, [{b"name": ME}])], ME, 16)
    assert (got, rejected) == ({STREAM: {"solo"}}, 0)


def test_consumers_of_the_streams_of_the_deployment_s_count_only() -> None:
    wide = keys.outbox_key(40)
    listing = [(STREAM, {"name": "a"}), (wide, {"name": "b"})]
    assert consumers_of(listing, ME, 64) == ({STREAM: {"a"}, wide: {"b"}}, 0)
    assert consumers_of(listing, ME, 16) == ({STREAM: {"a"}}, 1)  # {40} is none of ours


@pytest.mark.parametrize(
    "reply",
    [
        None,
        b"not json",
        b"[]",
        b'{"e": 1, "d": []}',
        b'{"e": [], "d": 1}',
        b'{"e": [1], "d": []}',
        b'{"e": [["1-1"]], "d": []}',
        b'{"e": [[1, []]], "d": []}',
        b'{"e": [["1-1", {}]], "d": []}',
        b'{"e": [["1-1", ["e"]]], "d": []}',
    ],
)
def test_unreadable_reclaim_replies(reply: Any) -> None:
    assert taken_entries(Reclaimed(STREAM, reply)) is None


def test_taken_entries() -> None:
    got = taken_entries(Reclaimed(STREAM, b'{"e": [["1-1", ["e", "x"]]], "d": ["a", "b"]}'))
    assert got == ([(STREAM, "1-1", {"e": "x"})], 2)


@pytest.mark.parametrize("count", [16, 64])
def test_hand_back(count: int) -> None:
    calls = hand_back(ME, count)
    assert calls[0] == ForgetHeartbeat(keys.heartbeat_key(ME))
    assert calls[1:] == [Reclaim(keys.outbox_key(s), "", 0, (ME,)) for s in range(count)]


def test_every_effect_a_delivery_driver_runs_is_in_its_union_with_its_answer() -> None:
    """The drivers' dispatch tables are checked against ``DeliveryEffect``: hand_back()'s
    effects must be in it too, each with what answers it (a closing instance's included)."""
    union = set(typing.get_args(DeliveryEffect))
    assert {type(effect) for effect in hand_back(ME, 16)} <= union
    assert set(_ANSWERS) == union
    forget = ForgetHeartbeat(keys.heartbeat_key(ME))
    assert isinstance(nothing_done(forget), _ANSWERS[ForgetHeartbeat])


def test_heartbeat_key_is_in_the_fleet_slot() -> None:
    assert keys.heartbeat_key("h:1:ab") == "outpost:v2:{fleet}:alive:h%3A1%3Aab"
    assert keys.BUDGET_KEY == "outpost:v2:{fleet}:budget"
