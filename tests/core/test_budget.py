"""The shared request budget (``_budget``) and byte-bounded batches in a delivery loop."""

from __future__ import annotations

import json
from typing import Any

import pytest

from outpost_core import UsageError
from outpost_core import _keys as keys
from outpost_core._budget import BudgetAnswered, TakeRequest, capacity, take, wait_of
from outpost_core._delivery import (
    BatchAnswered,
    DeliverySettings,
    Done,
    OutboxRead,
    PostBatch,
    ReadOutbox,
    ReportDropped,
    Reported,
    Settled,
    SettleScript,
    Sleep,
)
from tests.core.test_delivery import BUCKET, ST1, STREAM, Loop, body, entries


def budgeted_loop(**settings: Any) -> Loop:
    """A delivery loop past its first claim, with a budget of 300 requests a minute and no
    linger unless ``settings`` say otherwise."""
    settings.setdefault("requests_per_minute", 300.0)
    settings.setdefault("linger", 0.0)
    return Loop(DeliverySettings(**settings))


TAKE = TakeRequest(keys.BUDGET_KEY, 300.0, 20)


def big(event_id: str, pad: int) -> tuple[str, str, dict[bytes, bytes]]:
    event = {"name": "api_call", "external_id": event_id, "metadata": {"pad": "x" * pad}}
    return (
        STREAM,
        f"1-{event_id}",
        {
            b"e": json.dumps(event).encode(),
            b"f": f"{BUCKET}:{event_id}".encode(),
            b"k": json.dumps([ST1]).encode(),
        },
    )


def test_settings() -> None:
    s = DeliverySettings()
    assert (s.requests_per_minute, s.batch_bytes) == (0.0, 8 * 1024 * 1024)
    with pytest.raises(UsageError, match="requests_per_minute"):
        DeliverySettings(requests_per_minute=-1)
    with pytest.raises(UsageError, match="batch_bytes"):
        DeliverySettings(batch_bytes=1023)


def test_capacity_is_a_fifteenth_of_a_minute_at_least_one() -> None:
    assert (capacity(300), capacity(500), capacity(10)) == (20, 33, 1)
    assert take(300) == TAKE


@pytest.mark.parametrize(
    ("reply", "wait"),
    [
        (0, 0.0),
        (b"250000", 0.25),
        (10**9, 60.0),
        (b"soon", None),
        (-1, None),
        (True, None),
        ("5", None),
        (None, None),
    ],
)
def test_wait_of(reply: Any, wait: float | None) -> None:
    assert wait_of(BudgetAnswered(reply)) == wait


def test_a_request_is_taken_before_each_post_and_the_batch_grows_while_waiting() -> None:
    loop = budgeted_loop(batch_size=2)
    loop.step(OutboxRead(entries("a")))
    assert loop.step(BudgetAnswered(0)) == TAKE
    assert loop.step(BatchAnswered(200)) == PostBatch(body("a"), 1)
    loop.step(Settled())  # acknowledge
    loop.step(OutboxRead(entries("b")))
    assert loop.step(BudgetAnswered(500_000)) == TAKE  # the next request, in 0.5 s
    # Meanwhile it reads on, beyond batch_size: the request carries them all.
    assert loop.step(OutboxRead(entries("c", "d"))) == ReadOutbox(count=2, block=0.5)
    assert loop.step(OutboxRead([]), now=0.2) == ReadOutbox(count=2, block=0.3)
    loop.now = 0.5
    assert loop.effect() == PostBatch(body("b", "c", "d"), 3)


def test_a_full_batch_waits_for_the_budget_without_reading() -> None:
    loop = budgeted_loop(batch_bytes=1024)
    loop.step(OutboxRead([big("a", 600), big("b", 600)]))
    assert loop.step(BudgetAnswered(b"2000000")) == TAKE
    assert loop.effect() == Sleep(2.0)  # the buffer holds a batch's worth already


def test_a_retry_takes_a_request_too() -> None:
    loop = budgeted_loop()
    loop.step(OutboxRead(entries("a")))
    loop.step(BudgetAnswered(0))
    loop.step(BatchAnswered(500))  # retried after a backoff of 0.5 s
    loop.step(Done(), now=0.5)  # refresh the claim
    assert loop.step(BudgetAnswered(1_000_000)) == TAKE
    assert loop.effect() == Sleep(1.5)  # a batch in flight does not read more


def test_an_unreadable_budget_reply_is_counted_and_the_request_goes() -> None:
    loop = budgeted_loop()
    loop.step(OutboxRead(entries("a")))
    loop.step(BudgetAnswered(b"junk"))
    assert loop.delivery.rejected_entries == 1
    assert loop.effect() == PostBatch(body("a"), 1)


def test_batches_stay_under_batch_bytes() -> None:
    loop = budgeted_loop(batch_bytes=2048, requests_per_minute=0.0)
    loop.step(OutboxRead([big(i, 900) for i in "abcd"]))
    first = loop.effect()
    assert first.size == 2 and len(first.body) <= 2048
    loop.report(BatchAnswered(200))
    loop.step(Settled())
    assert loop.effect().size == 2


def test_an_event_too_large_for_any_batch_is_dropped_and_reported() -> None:
    loop = budgeted_loop(batch_bytes=1024)
    loop.step(OutboxRead([big("huge", 2000), *entries("a")]))
    report = loop.step(Reported())
    assert isinstance(report, ReportDropped)
    assert report.reason == "larger than an ingestion request may be (1024 bytes)"
    assert [e["external_id"] for e in report.events] == ["huge"]
    confirm = loop.step(Settled())
    assert isinstance(confirm, SettleScript) and confirm.script == "confirm"
    assert "1-huge" in confirm.args
    assert loop.step(BudgetAnswered(0)) == TAKE
    assert loop.effect() == PostBatch(body("a"), 1)


def test_without_a_budget_nothing_is_taken() -> None:
    loop = budgeted_loop(requests_per_minute=0.0)
    loop.step(OutboxRead(entries("a")))
    assert loop.effect() == PostBatch(body("a"), 1)
