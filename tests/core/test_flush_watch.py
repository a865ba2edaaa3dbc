"""What a flush waits for, and when it reads the outboxes to see."""

from __future__ import annotations

from outpost_core import FlushWatch, last_entries
from outpost_core._flush import LOOK

A, B = "outpost:v2:{0}:outbox", "outpost:v2:{1}:outbox"


def test_the_marks_are_each_streams_last_entry_and_a_peers_reply_gives_none() -> None:
    replies = [[[b"5-0", {b"e": b"{}"}]], []]
    assert last_entries([A, B], replies) == {A: b"5-0"}
    assert last_entries([A], [[("7-1", {})]]) == {A: "7-1"}
    odd: object
    for odd in (None, b"x", [None], [[]], [[5, {}]], [b"5-0"]):
        assert last_entries([A], [odd]) == {}


def test_nothing_queued_is_done_at_once() -> None:
    assert FlushWatch({}, now=0.0, timeout=1.0).done


def test_done_once_every_stream_holds_nothing_up_to_its_mark() -> None:
    watch = FlushWatch({A: b"5-0", B: b"9-0"}, now=0.0, timeout=1.0)
    assert watch.look_now(0.0, settling=False, holding_nothing=False)  # the first look: at once
    assert not watch.looked({A: False, B: True})
    assert watch.marks == {B: b"9-0"}  # the next look reads B only
    assert watch.looked({B: False}) and watch.done


def test_it_looks_when_the_loops_hold_nothing_or_every_look_interval() -> None:
    watch = FlushWatch({A: b"5-0"}, now=0.0, timeout=1.0)
    assert watch.look_now(0.0, settling=False, holding_nothing=False)
    assert not watch.look_now(0.01, settling=False, holding_nothing=False)  # a backlog's batch
    assert watch.look_now(0.02, settling=False, holding_nothing=True)  # the last settled
    assert not watch.look_now(0.02 + LOOK / 2, settling=False, holding_nothing=False)
    assert watch.look_now(0.02 + LOOK, settling=False, holding_nothing=False)  # others settle


def test_never_while_a_settle_runs() -> None:
    watch = FlushWatch({A: b"5-0"}, now=0.0, timeout=1.0)
    assert not watch.look_now(5.0, settling=True, holding_nothing=True)
    assert watch.look_now(5.0, settling=False, holding_nothing=True)


def test_it_waits_a_look_interval_at_most_and_times_out() -> None:
    watch = FlushWatch({A: b"5-0"}, now=10.0, timeout=1.0)
    assert watch.wait(10.0) == LOOK
    almost = watch.wait(10.99)
    assert almost is not None and almost < LOOK
    assert watch.wait(11.0) is None
