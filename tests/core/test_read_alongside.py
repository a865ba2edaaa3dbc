"""Reading the next batch while one is posted (``DeliverySettings.read_alongside``), and reads
sized to about one batch across the streams that hold entries."""

from __future__ import annotations

from typing import Any

import pytest

from outpost_core import UsageError
from outpost_core._delivery import (
    BatchAnswered,
    BatchFailed,
    DeliverySettings,
    Flushing,
    OutboxRead,
    PostAndSettle,
    PostBatch,
    PostedAlongside,
    ReadOutbox,
    Settled,
    SettleScripts,
    Sleep,
    nothing_done,
)
from tests.core.test_delivery import OTHER, Loop, body, entries, settle
from tests.core.test_settle_alongside import alongside


def pipelined(**settings: Any) -> Loop:
    return alongside(read_alongside=True, **settings)


def answered(status: int, *ids: str, stream: str | None = None) -> PostedAlongside:
    found = entries(*ids) if stream is None else entries(*ids, stream=stream)
    return PostedAlongside(BatchAnswered(status), OutboxRead(found))


def test_off_by_default_a_read_asks_each_stream_for_a_whole_batch() -> None:
    assert not DeliverySettings().read_alongside
    loop = Loop(DeliverySettings(batch_size=32, linger=0.0))
    assert loop.step(OutboxRead(entries("a"))) == ReadOutbox(count=32, block=0.5)
    assert loop.effect() == PostBatch(body("a"), 1)


def test_the_first_read_asks_each_stream_for_its_share_of_a_batch() -> None:
    # 16 streams: a read for 32 asks each for 3 (an eighth more, as streams give unevenly), so
    # it brings about one batch, not 16.
    loop = pipelined(batch_size=32)
    assert loop.effect() == ReadOutbox(count=3, block=0.5)


def test_the_next_batch_is_read_while_one_is_posted() -> None:
    loop = pipelined(batch_size=4)
    assert loop.step(OutboxRead(entries("a") + entries("b", stream=OTHER))) == ReadOutbox(1, 0.5)
    # Both streams gave all they were asked: they may hold more, and a batch that is not full
    # reads again before it goes, each stream asked for its half of what is missing.
    assert loop.step(OutboxRead(entries("c") + entries("d", stream=OTHER))) == ReadOutbox(1, 0.0)
    first = PostAndSettle(PostBatch(body("a", "b", "c", "d"), 4), (), ReadOutbox(2, 0.0))
    assert loop.step(answered(200, "e", "f")) == first
    # One stream gave both: the next read asks it alone for what the batch lacks.
    assert loop.step(OutboxRead([])) == ReadOutbox(count=2, block=0.0)
    settled = (
        settle("acknowledge", ["a", "c"], ["a", "c"]),
        settle("acknowledge", ["b", "d"], ["b", "d"], stream=OTHER),
    )
    second = PostAndSettle(PostBatch(body("e", "f"), 2), settled, ReadOutbox(4, 0.0))
    assert loop.step(answered(200)) == second  # found none left: e and f go as they are
    assert loop.delivery.delivered == 6
    # Nothing more was found: the settle goes alone, with no second read for the next batch.
    assert loop.step(Settled()) == SettleScripts((settle("acknowledge", ["e", "f"], ["e", "f"]),))
    assert loop.delivery.idle
    assert loop.effect() == ReadOutbox(count=4, block=0.5)  # none filled: spread kept


def posting(loop: Loop, *ids: str) -> Any:
    """The post of ``ids``, read first (and found to be all there is)."""
    loop.read(*ids)
    effect = loop.effect()
    if isinstance(effect, ReadOutbox):
        loop.report(OutboxRead([]))
        effect = loop.effect()
    return effect


def test_a_buffer_holding_the_next_batch_already_posts_without_a_read() -> None:
    loop = pipelined(batch_size=2)
    loop.read("a", "b", "c", "d")
    assert loop.step(BatchAnswered(200)) == PostBatch(body("a", "b"), 2)
    effect = loop.effect()
    assert isinstance(effect, PostAndSettle)
    assert effect.read is not None  # c and d are the last in the buffer: read for more
    loop.report(answered(200))


def test_a_post_that_failed_waits_with_what_was_read_beside_it() -> None:
    loop = pipelined(batch_size=2)
    assert isinstance(posting(loop, "a"), PostAndSettle)
    loop.report(PostedAlongside(BatchFailed("reset", maybe_sent=False), OutboxRead([])))
    assert isinstance(loop.effect(), Sleep)  # Polar unreachable: the batch waits
    assert not loop.delivery.idle


def test_reads_found_alongside_a_failed_post_join_the_buffer() -> None:
    loop = pipelined(batch_size=2)
    assert isinstance(posting(loop, "a"), PostAndSettle)
    loop.report(PostedAlongside(BatchAnswered(503), OutboxRead(entries("b"))))
    loop.now = 10.0
    effect = loop.effect()  # the batch of a, its claim refreshed before it goes again
    assert effect.entries == ((entries("a")[0][0], "1-a"), (entries("b")[0][0], "1-b"))


def test_a_flush_posts_what_the_read_alongside_found() -> None:
    loop = pipelined(batch_size=5, linger=10.0)
    loop.delivery.handle(Flushing(True))
    loop.read("a")
    assert loop.step(OutboxRead([])) == ReadOutbox(count=4, block=0.0)  # the flush's read more
    assert loop.step(answered(200, "b")) == PostAndSettle(
        PostBatch(body("a"), 1), (), ReadOutbox(count=5, block=0.0)
    )
    effect = loop.effect()
    assert isinstance(effect, PostAndSettle)
    assert effect.post == PostBatch(body("b"), 1)


def test_a_post_with_a_read_is_answered_with_what_the_read_found() -> None:
    loop = pipelined(batch_size=2)
    assert isinstance(posting(loop, "a"), PostAndSettle)
    with pytest.raises(UsageError, match="answered by a PostedAlongside"):
        loop.report(BatchAnswered(200))
    loop.report(answered(200, "b", "c", "d", "e"))  # the machine waits for the right answer
    effect = loop.effect()  # b and c go; d and e are the next batch: no read
    assert isinstance(effect, PostAndSettle)
    assert effect.read is None
    with pytest.raises(UsageError, match="answered by the post's answer alone"):
        loop.report(answered(200))


def test_a_closing_instance_answers_the_read_with_nothing_found() -> None:
    action = PostAndSettle(PostBatch(b"{}", 1), (), ReadOutbox(count=1, block=0.0))
    assert nothing_done(action) == PostedAlongside(
        BatchFailed("the instance closed", maybe_sent=True), OutboxRead([])
    )
    assert nothing_done(PostAndSettle(PostBatch(b"{}", 1), ())) == BatchFailed(
        "the instance closed", maybe_sent=True
    )


def test_a_stall_is_reported_from_the_answer_of_a_post_with_a_read() -> None:
    loop = pipelined(batch_size=2)
    posting(loop, "a")
    loop.report(answered(401))
    assert loop.delivery.stalled is not None
    assert [r.message for r in loop.delivery.reports()] == [
        f"outpost delivery is stalled: {loop.delivery.stalled}"
    ]
