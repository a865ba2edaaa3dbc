"""Settling a batch while the next one is posted (``DeliverySettings.settle_alongside``)."""

from __future__ import annotations

from typing import Any

from outpost_core import _keys as keys
from outpost_core._budget import BudgetAnswered, TakeRequest
from outpost_core._delivery import (
    BatchAnswered,
    BatchFailed,
    DeliverySettings,
    Flushing,
    OutboxRead,
    PostAndSettle,
    PostBatch,
    ReadOutbox,
    RefreshClaim,
    ReportDropped,
    Reported,
    Settled,
    SettleScript,
    SettleScripts,
    Sleep,
    nothing_done,
)
from tests.core.test_delivery import Loop, body, entries, settle

TAKE = TakeRequest(keys.BUDGET_KEY, 300.0, 20)


def alongside(**settings: Any) -> Loop:
    settings.setdefault("linger", 0.0)
    return Loop(DeliverySettings(settle_alongside=True, **settings))


def test_off_by_default_a_batch_settles_before_the_loop_reads_on() -> None:
    assert not DeliverySettings().settle_alongside
    loop = Loop(DeliverySettings(batch_size=2, linger=0.0))
    loop.step(OutboxRead(entries("a", "b", "c", "d")))
    assert loop.step(BatchAnswered(200)) == PostBatch(body("a", "b"), 2)
    assert loop.effect() == settle("acknowledge", ["a", "b"], ["a", "b"])


def test_the_next_batch_goes_while_the_last_one_settles() -> None:
    loop = alongside(batch_size=2)
    loop.step(OutboxRead(entries("a", "b", "c", "d")))
    assert loop.step(BatchAnswered(200)) == PostBatch(body("a", "b"), 2)
    # Polar stored a and b: their settle runs while c and d are posted, never before the answer.
    first = settle("acknowledge", ["a", "b"], ["a", "b"])
    assert loop.step(BatchAnswered(200)) == PostAndSettle(PostBatch(body("c", "d"), 2), (first,))
    assert not loop.delivery.idle  # c and d are not settled yet
    # Nothing more to post: one read without blocking for a batch to carry the settle, then the
    # settle alone, at once.
    assert loop.step(OutboxRead([])) == ReadOutbox(count=2, block=0.0)
    second = settle("acknowledge", ["c", "d"], ["c", "d"])
    assert loop.step(Settled()) == SettleScripts((second,))
    assert loop.delivery.idle
    assert loop.delivery.delivered == 4
    assert loop.effect() == ReadOutbox(count=2, block=0.5)


def test_a_batch_not_due_yet_never_holds_a_settle_back() -> None:
    loop = alongside(batch_size=5, linger=0.2)
    loop.read("a")
    loop.now = 0.2
    loop.step(BatchAnswered(200))  # a
    loop.now = 0.21
    # One read for a next batch finds b, which lingers: the settle goes alone, not after it.
    assert loop.step(OutboxRead(entries("b"))) == ReadOutbox(count=5, block=0.0)
    assert loop.step(Settled()) == SettleScripts((settle("acknowledge", ["a"], ["a"]),))
    assert loop.effect() == Sleep(0.235)


def test_a_flush_posts_what_the_read_for_the_next_batch_found() -> None:
    loop = alongside(batch_size=5, linger=10.0)
    loop.delivery.handle(Flushing(True))
    loop.read("a")
    assert loop.step(OutboxRead([])) == ReadOutbox(count=4, block=0.0)  # the flush's read more
    loop.step(BatchAnswered(200))  # a
    assert loop.step(OutboxRead(entries("b"))) == ReadOutbox(count=5, block=0.0)
    assert loop.effect() == PostAndSettle(
        PostBatch(body("b"), 1), (settle("acknowledge", ["a"], ["a"]),)
    )


def test_a_request_is_taken_from_the_budget_before_the_post_that_carries_the_settle() -> None:
    loop = alongside(batch_size=1, requests_per_minute=300.0)
    loop.step(OutboxRead(entries("a", "b")))
    assert loop.step(BudgetAnswered(0)) == TAKE
    loop.step(BatchAnswered(200))  # a
    assert loop.step(BudgetAnswered(0)) == TAKE
    assert loop.effect() == PostAndSettle(
        PostBatch(body("b"), 1), (settle("acknowledge", ["a"], ["a"]),)
    )


def test_when_the_budget_makes_the_next_batch_wait_the_settle_goes_first() -> None:
    loop = alongside(batch_size=1, requests_per_minute=300.0)
    loop.step(OutboxRead(entries("a", "b", "c")))
    loop.step(BudgetAnswered(0))
    loop.step(BatchAnswered(200))  # a: one batch_size, the budget did not make it wait
    assert loop.step(BudgetAnswered(200_000)) == TAKE
    assert loop.step(Settled()) == SettleScripts((settle("acknowledge", ["a"], ["a"]),))
    # Having waited, the request carries all that was read meanwhile.
    assert loop.effect(0.2) == PostBatch(body("b", "c"), 2)


def test_a_split_batch_settles_what_was_stored_before_it_goes_again() -> None:
    loop = alongside()
    loop.read("a", "b")
    loop.step(BatchAnswered(413))  # bisected into [a], [b]
    assert loop.post() == PostBatch(body("a"), 1)  # its claim refreshed first
    loop.report(BatchAnswered(200))
    assert isinstance(loop.effect(), SettleScripts)
    loop.report(Settled())
    assert isinstance(loop.effect(), RefreshClaim)


def test_a_dropped_event_is_reported_before_its_settle_goes_alongside() -> None:
    loop = alongside(batch_size=1)
    loop.step(OutboxRead(entries("a", "b")))
    loop.step(BatchAnswered(422, b'{"detail": [{"loc": ["body", "events", 0, "name"]}]}'))
    assert isinstance(loop.step(Reported()), ReportDropped)
    confirm = settle("confirm", ["a"], ["a"])
    assert loop.effect() == PostAndSettle(PostBatch(body("b"), 1), (confirm,))


def test_nothing_done_while_closing() -> None:
    post = PostBatch(b"{}", 1)
    failed = BatchFailed("the instance closed", maybe_sent=True)
    assert nothing_done(post) == failed
    assert nothing_done(PostAndSettle(post, ())) == failed
    scripts = SettleScripts((SettleScript(script="acknowledge", keys=("s",), args=("a",)),))
    assert nothing_done(scripts) == Settled(None)
