"""Settling the entries of several batches in one script (``DeliverySettings.settle_every``)."""

from __future__ import annotations

from typing import Any

import pytest

from outpost_core import UsageError
from outpost_core import _keys as keys
from outpost_core._budget import BudgetAnswered, TakeRequest
from outpost_core._delivery import (
    BatchAnswered,
    DeliverySettings,
    OutboxRead,
    PostAndSettle,
    PostBatch,
    PostedAlongside,
    ReadOutbox,
    Settled,
    SettleScripts,
)
from tests.core.test_delivery import OTHER, Loop, body, entries, settle
from tests.core.test_settle_alongside import alongside


def together(**settings: Any) -> Loop:
    return alongside(settle_every=4, **settings)


def test_off_by_default_and_never_negative() -> None:
    assert DeliverySettings().settle_every == 0
    with pytest.raises(UsageError, match="settle_every"):
        DeliverySettings(settle_every=-1)


def test_batches_that_follow_each_other_settle_in_one_script() -> None:
    loop = together(batch_size=2)
    loop.read("a", "b", "c", "d", "e", "f")
    assert loop.step(BatchAnswered(200)) == PostBatch(body("a", "b"), 2)
    # c and d go at once: a and b wait for them rather than settle alone.
    assert loop.step(BatchAnswered(200)) == PostBatch(body("c", "d"), 2)
    assert not loop.delivery.idle
    # Four are held: one script settles them, while e and f are posted.
    both = settle("acknowledge", ["a", "b", "c", "d"], ["a", "b", "c", "d"])
    assert loop.step(BatchAnswered(200)) == PostAndSettle(PostBatch(body("e", "f"), 2), (both,))
    assert loop.delivery.delivered == 6


def test_acknowledged_entries_settle_at_once_when_no_batch_goes_next() -> None:
    loop = together(batch_size=2)
    loop.read("a", "b")
    loop.step(BatchAnswered(200))
    assert loop.step(OutboxRead([])) == ReadOutbox(count=2, block=0.0)  # for a batch to carry it
    assert loop.step(Settled()) == SettleScripts((settle("acknowledge", ["a", "b"], ["a", "b"]),))
    assert loop.delivery.idle


def test_a_batch_waiting_to_be_retried_holds_no_settle_back() -> None:
    loop = together(batch_size=2)
    loop.read("a", "b", "c", "d", "e", "f")
    loop.step(BatchAnswered(200))  # a, b
    assert loop.step(BatchAnswered(503)) == PostBatch(body("c", "d"), 2)  # waits its backoff
    assert loop.effect() == SettleScripts((settle("acknowledge", ["a", "b"], ["a", "b"]),))


def test_a_request_the_budget_makes_wait_holds_no_settle_back() -> None:
    loop = together(batch_size=2, requests_per_minute=300.0)
    loop.read("a", "b", "c", "d")
    loop.step(BudgetAnswered(0))
    loop.step(BatchAnswered(200))  # a, b
    assert loop.step(BudgetAnswered(10_000)) == TakeRequest(keys.BUDGET_KEY, 300.0, 20)
    assert loop.step(Settled()) == SettleScripts((settle("acknowledge", ["a", "b"], ["a", "b"]),))
    assert not isinstance(loop.effect(), PostBatch)  # c and d wait for their request


def test_each_post_carries_about_one_batch_of_settles_and_the_rest_go_beside_the_next() -> None:
    # Four batches' settles beside one post held the next post back (Redis settles four batches
    # slower than Polar stores one): they go a batch's worth at a time, a stream's script whole.
    loop = together(batch_size=2)
    assert isinstance(loop.effect(), ReadOutbox)
    found = entries("a") + entries("b", stream=OTHER) + entries("c") + entries("d", stream=OTHER)
    loop.report(OutboxRead(found + entries("e", "f", "g", "h", "i", "j")))
    assert loop.step(BatchAnswered(200)) == PostBatch(body("a", "b"), 2)
    assert loop.step(BatchAnswered(200)) == PostBatch(body("c", "d"), 2)
    first = settle("acknowledge", ["a", "c"], ["a", "c"])
    assert loop.step(BatchAnswered(200)) == PostAndSettle(PostBatch(body("e", "f"), 2), (first,))
    other = settle("acknowledge", ["b", "d"], ["b", "d"], stream=OTHER)
    assert loop.step(BatchAnswered(200)) == PostAndSettle(PostBatch(body("g", "h"), 2), (other,))
    assert loop.delivery.delivered == 8


def test_the_last_batch_known_carries_every_settle_left() -> None:
    # A flush ended with the entries of its last few batches settling alone after its last post:
    # a batch that empties the buffer, with no read finding more, carries every settle queued
    # and every acknowledged entry held (no later post would carry them).
    loop = together(batch_size=2)
    assert isinstance(loop.effect(), ReadOutbox)
    found = entries("a") + entries("b", stream=OTHER) + entries("c") + entries("d", stream=OTHER)
    loop.report(OutboxRead(found + entries("e", "f", "g", "h")))
    loop.step(BatchAnswered(200))  # a, b
    loop.step(BatchAnswered(200))  # c, d: four held, two scripts queued
    loop.step(BatchAnswered(200))  # e, f, beside the first script
    first = settle("acknowledge", ["b", "d"], ["b", "d"], stream=OTHER)
    held = settle("acknowledge", ["e", "f"], ["e", "f"])
    assert loop.step(BatchAnswered(200)) == PostAndSettle(
        PostBatch(body("g", "h"), 2), (first, held)
    )
    # Only the last batch's own settle is left once its answer came.
    assert loop.step(OutboxRead([])) == ReadOutbox(count=2, block=0.0)
    assert loop.step(Settled()) == SettleScripts((settle("acknowledge", ["g", "h"], ["g", "h"]),))
    assert loop.delivery.idle


def test_a_batch_after_which_a_read_found_more_carries_one_batch_of_settles() -> None:
    loop = together(batch_size=2, read_alongside=True)
    assert loop.effect() == ReadOutbox(count=1, block=0.5)  # each stream's share
    loop.report(OutboxRead(entries("a", "b")))  # its stream gave all it was asked: more may wait
    post = loop.effect()
    assert post == PostAndSettle(PostBatch(body("a", "b"), 2), (), ReadOutbox(count=2, block=0.0))
    loop.report(PostedAlongside(BatchAnswered(200), OutboxRead(entries("c", "d"))))
    # c and d empty the buffer, but the read gave all it was asked: a and b wait for more.
    assert loop.effect() == PostAndSettle(
        PostBatch(body("c", "d"), 2), (), ReadOutbox(count=2, block=0.0)
    )


def test_without_settling_alongside_the_last_batch_carries_nothing() -> None:
    loop = Loop(DeliverySettings(batch_size=2, linger=0.0, settle_every=4))
    loop.read("a", "b", "c", "d")
    loop.step(BatchAnswered(200))  # a, b: held to settle with the next
    assert loop.effect() == PostBatch(body("c", "d"), 2)
