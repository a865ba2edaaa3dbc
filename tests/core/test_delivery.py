"""Delivery of the outbox to Polar (``_delivery``): batching, retries, splitting, settling."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import pytest

from outpost_core import ConfigurationError, Report, Tick, UsageError
from outpost_core import _keys as keys
from outpost_core._delivery import (
    GROUP,
    BatchAnswered,
    BatchFailed,
    ClaimStale,
    Delivery,
    DeliverySettings,
    Done,
    Flushing,
    OutboxEntry,
    OutboxRead,
    PostBatch,
    ReadOutbox,
    RefreshClaim,
    ReportDropped,
    Reported,
    Settled,
    SettleScript,
    Sleep,
    retry_after,
)
from tests.core._polar import FixedRandom

STREAM = keys.all_outboxes()[3]
OTHER = keys.all_outboxes()[7]
BUCKET = 1_796_223_600_000_000
WALL = BUCKET + 5_000_000
ST1 = "outpost:v2:{3}:external:c1:r1"
ST2 = "outpost:v2:{3}:external:c1:r2"


def item(event_id: str) -> dict[str, Any]:
    return {"name": "api_call", "external_customer_id": "c1", "external_id": event_id}


def fields(event_id: str, states: tuple[str, ...] = (ST1,)) -> dict[bytes, bytes]:
    return {
        b"e": json.dumps(item(event_id)).encode(),
        b"f": f"{BUCKET}:{event_id}".encode(),
        b"k": json.dumps(list(states)).encode(),
    }


def entries(*ids: str, stream: str = STREAM) -> list[tuple[str, str, Any]]:
    return [(stream, f"1-{i}", fields(i)) for i in ids]


def body(*ids: str) -> bytes:
    """The ingestion body: the queued items, byte for byte, in a list."""
    return b'{"events":[' + b",".join(json.dumps(item(i)).encode() for i in ids) + b"]}"


class Loop:
    """Drives a Delivery as a driver's loop does: the time, the effect drained, the time and
    what came of it. (Shared by the budget and liveness tests.)"""

    def __init__(
        self, settings: DeliverySettings | None = None, draw: float = 0.5, *, claimed: bool = True
    ) -> None:
        settings = settings or DeliverySettings()
        self.delivery = Delivery(settings, FixedRandom(draw), now=0.0)
        self.now = 0.0
        if claimed:  # the loop's first question, what dead consumers held: nothing
            assert self.effect() == ClaimStale(min_idle=300.0, count=settings.batch_size)
            self.report(Done())

    def effect(self, now: float | None = None) -> Any:
        if now is not None:
            self.now = now
        self.delivery.handle(Tick(self.now, WALL))
        (effect,) = self.delivery.effects()
        return effect

    def report(self, outcome: Any) -> None:
        self.delivery.handle(Tick(self.now, WALL))
        self.delivery.handle(outcome)

    def step(self, outcome: Any, now: float | None = None) -> Any:
        """The next effect, answered with ``outcome``; returns the effect."""
        action = self.effect(now)
        self.report(outcome)
        return action

    def read(self, *ids: str) -> None:
        assert isinstance(self.effect(), ReadOutbox)
        self.report(OutboxRead(entries(*ids)))

    def post(self, now: float | None = None) -> PostBatch:
        action = self.effect(now)
        if isinstance(action, RefreshClaim):
            self.report(Done())
            action = self.effect()
        assert isinstance(action, PostBatch), action
        return action

    def work(self, count: int) -> list[Any]:
        """Run the ``count`` settle scripts and reports a batch left."""
        out = []
        for _ in range(count):
            action = self.effect()
            assert isinstance(action, SettleScript | ReportDropped), action
            out.append(action)
            self.report(Settled() if isinstance(action, SettleScript) else Reported())
        return out


def settle(script: str, ids: list[str], field_ids: list[str], *, stream: str = STREAM) -> Any:
    args = [keys.channel(keys.all_outboxes().index(stream)), GROUP, str(WALL), str(len(ids))]
    args += [f"1-{i}" for i in ids]
    key_list = [stream]
    if field_ids:
        key_list += [ST1, keys.acked_key(ST1)]
        args += ["-1", str(len(field_ids)), *(f"{BUCKET}:{i}" for i in field_ids)]
    return SettleScript(script=script, keys=tuple(key_list), args=tuple(args))


# -- settings -------------------------------------------------------------------------------------


def test_default_settings() -> None:
    s = DeliverySettings()
    assert (s.batch_size, s.linger, s.max_attempts, s.read_block) == (500, 0.2, 10, 0.5)
    assert (s.backoff_base, s.backoff_cap, s.stall_delay) == (0.5, 60.0, 30.0)
    assert (s.claim_idle, s.claim_interval) == (300.0, 30.0)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"batch_size": 0}, "at least 1"),
        ({"max_attempts": 0}, "at least 1"),
        ({"linger": -0.1}, "linger must be a finite number, not negative"),
        ({"backoff_base": -1}, "backoff_base must be a finite number, not negative"),
        ({"claim_idle": -1}, "claim_idle must be a finite number, not negative"),
        ({"read_block": -1}, "must be a finite number, not negative"),
        ({"batch_size": float("nan")}, "batch_size must be an integer"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"batch_size": True}, "batch_size must be an integer"),
        ({"max_attempts": 1.0}, "max_attempts must be an integer"),
        ({"batch_bytes": 1023}, "at least 1024"),
        ({"batch_bytes": float("inf")}, "batch_bytes must be an integer"),
        ({"settle_every": -1}, "settle_every must be an integer, not negative"),
        ({"heartbeat": 0}, "heartbeat must be a positive, finite number"),
        ({"heartbeat": float("inf")}, "heartbeat must be a positive, finite number"),
        ({"heartbeat": "10"}, "heartbeat must be a positive, finite number"),
        ({"requests_per_minute": -1}, "requests_per_minute must be a finite number"),
        ({"requests_per_minute": float("nan")}, "requests_per_minute must be a finite number"),
        ({"linger": float("nan")}, "linger must be a finite number"),
        ({"backoff_cap": float("inf")}, "backoff_cap must be a finite number"),
        ({"stall_delay": -1}, "stall_delay must be a finite number"),
        ({"claim_interval": float("nan")}, "claim_interval must be a finite number"),
        ({"flush_block": True}, "flush_block must be a finite number"),
    ],
)
def test_settings_refuse(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        DeliverySettings(**arguments)


# -- the loop -------------------------------------------------------------------------------------


def test_one_question_at_a_time() -> None:
    delivery = Delivery(DeliverySettings(), FixedRandom(), now=0.0)
    delivery.handle(Tick(0.0, WALL))
    with pytest.raises(UsageError, match="no action outstanding"):
        delivery.handle(Done())
    delivery.effects()
    with pytest.raises(UsageError, match="report the outcome of the last action first"):
        delivery.effects()
    with pytest.raises(UsageError, match="not a delivery outcome"):
        delivery.handle("done")  # type: ignore[arg-type]


def test_an_outcome_for_another_action_is_a_usage_error() -> None:
    loop = Loop()
    assert isinstance(loop.effect(), ReadOutbox)
    with pytest.raises(UsageError):
        loop.report(BatchAnswered(200))


def test_reads_linger_then_post_then_acknowledge() -> None:
    loop = Loop()
    assert loop.effect() == ReadOutbox(count=500, block=0.5)
    loop.report(OutboxRead([]))
    assert loop.delivery.idle
    assert loop.effect(1.0) == ReadOutbox(count=500, block=0.5)
    loop.report(OutboxRead(entries("a", "b")))
    assert not loop.delivery.idle
    # Lingering, it reads what came every linger / 8 seconds, without blocking: not one read
    # (and one wake-up) per event.
    assert loop.effect(1.01) == Sleep(1.025)
    loop.report(Done())
    assert loop.effect(1.05) == ReadOutbox(count=498, block=0.0)
    loop.report(OutboxRead(entries("c")))
    assert loop.effect(1.06) == Sleep(1.075)
    loop.report(Done())
    assert loop.effect(1.2) == PostBatch(body=body("a", "b", "c"), size=3)
    loop.report(BatchAnswered(200, b'{"inserted":3,"duplicates":0}'))
    assert loop.work(1) == [settle("acknowledge", ["a", "b", "c"], ["a", "b", "c"])]
    assert loop.delivery.idle
    assert loop.delivery.delivered == 3


def test_a_lingering_loop_sleeps_at_most_until_the_batch_is_due() -> None:
    loop = Loop(DeliverySettings(linger=0.08))
    loop.read("a")
    assert loop.effect(0.0) == Sleep(0.01)
    loop.report(Done())
    assert loop.effect(0.075) == ReadOutbox(count=499, block=0.0)
    loop.report(OutboxRead([]))
    assert loop.effect(0.076) == Sleep(0.08)  # due before the next read


def test_a_long_linger_still_reads_every_read_block() -> None:
    loop = Loop(DeliverySettings(linger=3600.0, read_block=0.5))
    loop.read("a")
    assert loop.effect(0.0) == Sleep(0.5)


def test_a_full_buffer_posts_at_once_and_keeps_the_rest() -> None:
    loop = Loop(DeliverySettings(batch_size=2))
    loop.read("a", "b", "c")
    assert loop.effect() == PostBatch(body=body("a", "b"), size=2)
    loop.report(BatchAnswered(204))
    loop.work(1)
    # The rest has lingered as long as the first two: it goes next.
    assert loop.effect(0.3) == PostBatch(body=body("c"), size=1)


def test_flushing_posts_without_lingering_and_reads_blocking_briefly() -> None:
    loop = Loop()
    loop.delivery.handle(Flushing(True))
    # Never 0 (no BLOCK at all): a read that returns at once would spin Redis during a flush.
    assert loop.effect() == ReadOutbox(count=500, block=0.01)
    loop.report(OutboxRead(entries("a")))
    # Once more, without blocking: what was queued by the flush goes in the same batch.
    assert loop.effect() == ReadOutbox(count=499, block=0.0)
    loop.report(OutboxRead(entries("b")))
    assert loop.effect() == PostBatch(body=body("a", "b"), size=2)


def test_a_flush_reads_once_more_before_a_batch_that_was_lingering() -> None:
    loop = Loop()
    loop.read("a")  # lingering: the next read is linger / 8 away
    loop.delivery.handle(Flushing(True))
    assert loop.effect() == ReadOutbox(count=499, block=0.0)
    loop.report(OutboxRead(entries("b", "c")))
    assert loop.effect() == PostBatch(body=body("a", "b", "c"), size=3)


def test_stale_entries_are_claimed_every_claim_interval() -> None:
    loop = Loop(DeliverySettings(claim_interval=30.0))
    assert isinstance(loop.effect(29.9), ReadOutbox)
    loop.report(OutboxRead([]))
    assert loop.effect(30.0) == ClaimStale(min_idle=300.0, count=500)
    loop.report(OutboxRead(entries("old")))
    assert loop.effect(30.3) == PostBatch(body=body("old"), size=1)


REDIS_ID: Any = b"1-c"  # ids as Redis answers them: bytes


def test_entries_of_several_streams_and_identities_settle_per_stream() -> None:
    loop = Loop()
    assert isinstance(loop.effect(), ReadOutbox)
    loop.report(
        OutboxRead(
            [
                (STREAM, "1-a", fields("a", (ST1, ST2))),
                (OTHER, "2-b", fields("b", ())),
                (STREAM, REDIS_ID, {k.decode(): v.decode() for k, v in fields("c").items()}),
            ]
        )
    )
    loop.post(1.0)
    loop.report(BatchAnswered(200))
    first, second = loop.work(2)
    assert first.keys == (STREAM, ST1, keys.acked_key(ST1), ST2, keys.acked_key(ST2))
    assert first.args == (
        keys.channel(3),
        GROUP,
        str(WALL),
        "2",
        "1-a",
        "1-c",
        "-1",
        "2",
        f"{BUCKET}:a",
        f"{BUCKET}:c",
        "-1",
        "1",
        f"{BUCKET}:a",
    )
    assert second == SettleScript(
        script="acknowledge",
        keys=(OTHER,),
        args=(keys.channel(7), GROUP, str(WALL), "1", "2-b"),
    )


@pytest.mark.parametrize(
    "bad",
    [
        (STREAM, b"\xff", fields("x")),
        (STREAM, "1-x", {b"e": b"{}", b"f": b"0:x"}),
        (STREAM, "1-x", {b"e": b"{", b"f": b"0:x", b"k": b"[]"}),
        (STREAM, "1-x", {b"e": b"[]", b"f": b"0:x", b"k": b"[]"}),
        (STREAM, "1-x", {b"e": b"{}", b"f": b"0:x", b"k": b"{}"}),
        (STREAM, "1-x", {b"e": b"{}", b"f": b"0:x", b"k": b"[1]"}),
        (STREAM, "1-x", {b"e": b"\xff", b"f": b"0:x", b"k": b"[]"}),
        (STREAM, "1-x", {1: b"{}", b"f": b"0:x", b"k": b"[]"}),
        (STREAM, "1-x", {b"e": b"[" * 100_000, b"f": b"0:x", b"k": b"[]"}),  # RecursionError
        (STREAM, "1-x", {b"e": b"{}", b"f": b"0:x", b"k": b"["}),
        (STREAM, "1-x", {b"e": b"{}", b"f": b"\xff", b"k": b"[]"}),
    ],
)
def test_malformed_entries_are_counted_and_removed(bad: tuple[Any, Any, Any]) -> None:
    loop = Loop()
    assert isinstance(loop.effect(), ReadOutbox)
    loop.report(OutboxRead([bad, *entries("ok")]))
    assert loop.delivery.rejected_entries == 1
    if isinstance(bad[1], str):  # an id Redis could have written: remove the entry
        assert loop.effect() == SettleScript(
            script="confirm",
            keys=(STREAM,),
            args=(keys.channel(3), GROUP, str(WALL), "1", bad[1]),
        )
        loop.report(Settled())
    assert loop.post(1.0) == PostBatch(body=body("ok"), size=1)


def test_entries_read_by_a_client_that_decodes_replies() -> None:
    loop = Loop()
    assert isinstance(loop.effect(), ReadOutbox)
    decoded = {k.decode(): v.decode() for k, v in fields("a").items()}
    loop.report(OutboxRead([(STREAM, "1-a", decoded)]))
    assert loop.post(1.0) == PostBatch(body=body("a"), size=1)


def test_an_event_that_is_not_json_inside_its_braces_is_dropped_as_it_reads() -> None:
    loop = Loop()
    assert isinstance(loop.effect(), ReadOutbox)
    loop.report(OutboxRead([(STREAM, "1-a", {**fields("a"), b"e": b"{bad}"})]))
    loop.post(1.0)
    loop.report(BatchAnswered(400))  # Polar cannot parse the body
    report = loop.effect()
    assert report.events == ({"unreadable": "{bad}"},)


@pytest.mark.parametrize("stream", [STREAM.encode(), "not-an-outbox"])
def test_an_entry_of_an_unknown_or_undecoded_stream(stream: Any) -> None:
    loop = Loop()
    assert isinstance(loop.effect(), ReadOutbox)
    loop.report(OutboxRead([(stream, "1-x", {b"e": b"{}"})]))
    assert loop.delivery.rejected_entries == 1


# -- answers from Polar ---------------------------------------------------------------------------


def unprocessable(*indexes: Any) -> bytes:
    detail = [{"loc": ["body", "events", i, "name"], "msg": "bad", "type": "x"} for i in indexes]
    return json.dumps({"detail": detail}).encode()


def test_a_422_that_names_its_events_drops_them_and_sends_the_rest_at_once() -> None:
    loop = Loop()
    loop.read("a", "b", "c")
    loop.post(1.0)
    loop.report(BatchAnswered(422, unprocessable(1, 1)))
    assert loop.work(2) == [
        ReportDropped(events=(item("b"),), reason="rejected by Polar (422)"),
        settle("confirm", ["b"], ["b"]),
    ]
    assert loop.delivery.dropped == 1
    assert loop.effect() == RefreshClaim(((STREAM, "1-a"), (STREAM, "1-c")))
    loop.report(Done())
    assert loop.effect() == PostBatch(body=body("a", "c"), size=2)
    loop.report(BatchAnswered(200))
    assert loop.work(1) == [settle("acknowledge", ["a", "c"], ["a", "c"])]


def test_before_an_attempt_every_held_entry_is_claimed_again_and_none_is_read_twice() -> None:
    # A read takes up to batch_size entries per stream, so entries wait behind a batch while it
    # waits out an outage: they must not go idle past claim_idle, or they would be claimed and
    # posted again.
    loop = Loop(DeliverySettings(batch_size=2, linger=5.0))
    loop.read("a", "b", "c")
    assert loop.effect(1.0) == PostBatch(body=body("a", "b"), size=2)
    loop.report(BatchAnswered(503))
    assert isinstance(loop.effect(), Sleep)
    loop.report(Done())
    assert loop.effect(3.0) == RefreshClaim(((STREAM, "1-a"), (STREAM, "1-b"), (STREAM, "1-c")))
    loop.report(Done())
    assert loop.effect() == PostBatch(body=body("a", "b"), size=2)
    loop.report(BatchAnswered(200))
    loop.work(1)
    # A claim of stale entries brings back one this loop holds: it is not buffered twice.
    assert isinstance(loop.effect(400.0), ClaimStale)
    loop.report(OutboxRead(entries("c", "d")))
    assert loop.post() == PostBatch(body=body("c", "d"), size=2)


def test_an_entry_claimed_back_as_bytes_is_not_buffered_twice() -> None:
    # redis-py answers with bytes; the loop holds the entries as text. A batch whose post and
    # settle outlast claim_idle leaves the entries behind it idle: the next claim brings them
    # back, and they must be recognised as held, or they are posted twice.
    loop = Loop(DeliverySettings(batch_size=2, linger=5.0))
    loop.read("a", "b", "c")
    assert loop.post(1.0) == PostBatch(body=body("a", "b"), size=2)
    loop.report(BatchAnswered(200))
    loop.work(1)
    assert isinstance(loop.effect(400.0), ClaimStale)
    as_bytes = [(s.encode(), i.encode(), f) for s, i, f in entries("c", "d")]
    loop.report(OutboxRead(as_bytes))
    assert loop.post() == PostBatch(body=body("c", "d"), size=2)


def test_what_a_loop_holds_is_tracked_as_entries_come_and_go() -> None:
    # A read skips the entries the loop still holds (in the buffer or a batch), and only those:
    # one it dropped or acknowledged is taken again if a claim brings it back.
    loop = Loop(DeliverySettings(batch_size=3, linger=5.0))
    loop.read("a", "b", "c")
    assert loop.post(1.0) == PostBatch(body=body("a", "b", "c"), size=3)
    loop.report(BatchAnswered(422, unprocessable(0)))  # "a" is dropped, "b" and "c" go again
    assert [type(a) for a in loop.work(2)] == [ReportDropped, SettleScript]
    assert isinstance(loop.effect(), RefreshClaim)
    loop.report(Done())
    assert loop.effect() == PostBatch(body=body("b", "c"), size=2)
    loop.report(BatchAnswered(200))
    loop.work(1)
    assert isinstance(loop.effect(400.0), ClaimStale)
    # "c" twice in one answer, "a" dropped and "b" acknowledged earlier, "d" new.
    loop.report(OutboxRead(entries("a", "b", "c", "c", "d")))
    assert loop.post() == PostBatch(body=body("a", "b", "c"), size=3)
    loop.report(BatchAnswered(200))
    loop.work(1)
    assert loop.post(406.0) == PostBatch(body=body("d"), size=1)  # the linger ran out


def test_a_422_that_names_every_event_drops_the_batch() -> None:
    loop = Loop()
    loop.read("a", "b")
    loop.post(1.0)
    loop.report(BatchAnswered(422, unprocessable(0, 1)))
    assert [type(a) for a in loop.work(2)] == [ReportDropped, SettleScript]
    assert loop.delivery.idle


@pytest.mark.parametrize(
    "answer",
    [
        b"",
        b"not json",
        b"[]",
        b'{"detail": "bad"}',
        b'{"detail": []}',
        unprocessable(5),
        unprocessable(-1),
        unprocessable("0"),
        unprocessable(True),
        json.dumps({"detail": [{"loc": ["body", "events"]}]}).encode(),
        json.dumps({"detail": [{"loc": ["query", "events", 0]}]}).encode(),
        json.dumps({"detail": ["x"]}).encode(),
        json.dumps({"detail": [{"loc": "body"}]}).encode(),
        b"[" * 100_000,  # nested past the parser's recursion limit
    ],
)
def test_a_422_without_usable_locations_bisects(answer: bytes) -> None:
    loop = Loop()
    loop.read("a", "b", "c")
    loop.post(1.0)
    loop.report(BatchAnswered(422, answer))
    assert loop.delivery.dropped == 0
    assert loop.post() == PostBatch(body=body("a"), size=1)
    loop.report(BatchAnswered(200))
    loop.work(1)
    assert loop.post() == PostBatch(body=body("b", "c"), size=2)


@pytest.mark.parametrize("status", [400, 413, 422])
def test_bisecting_down_to_the_bad_event(status: int) -> None:
    loop = Loop()
    loop.read("a", "b", "c", "d")
    loop.post(1.0)
    loop.report(BatchAnswered(status))  # [a b c d] -> [a b] [c d]
    assert loop.post().size == 2
    loop.report(BatchAnswered(200))
    loop.work(1)
    assert loop.post() == PostBatch(body=body("c", "d"), size=2)
    loop.report(BatchAnswered(status))  # -> [c] [d]
    assert loop.post() == PostBatch(body=body("c"), size=1)
    loop.report(BatchAnswered(status))
    assert loop.work(2) == [
        ReportDropped(events=(item("c"),), reason=f"rejected by Polar ({status})"),
        settle("confirm", ["c"], ["c"]),
    ]
    assert loop.post() == PostBatch(body=body("d"), size=1)


def too_early(*indexes: int, msg: str = "Value error, Timestamp must be in the past.") -> bytes:
    detail = [{"loc": ["body", "events", i, "timestamp"], "msg": msg} for i in indexes]
    return json.dumps({"detail": detail}).encode()


def test_timestamps_in_polars_future_wait_for_its_clock_and_drop_nothing() -> None:
    # This machine's clock runs ahead of Polar's: the events are valid a moment later.
    loop = Loop(DeliverySettings(max_attempts=1, backoff_base=1.0), draw=1.0)
    loop.read("a", "b")
    loop.post(1.0)
    loop.report(BatchAnswered(422, too_early(0, 1)))
    assert loop.delivery.stalled is not None and "clock is ahead" in loop.delivery.stalled
    assert not loop.delivery.blocked  # it passes by itself: a flush may still succeed
    assert loop.effect() == Sleep(2.0)
    loop.report(Done())
    assert loop.post(2.0) == PostBatch(body=body("a", "b"), size=2)
    loop.report(BatchAnswered(200))
    assert loop.delivery.dropped == 0 and loop.delivery.stalled is None


@pytest.mark.parametrize(
    "answer",
    [
        too_early(0, msg="Value error, something else"),  # not the clock: a real refusal
        json.dumps(
            {"detail": [{"loc": ["body", "events", 0, "name"], "msg": "must be in the past"}]}
        ).encode(),
        json.dumps({"detail": [{"loc": "timestamp", "msg": "must be in the past"}]}).encode(),
    ],
)
def test_other_refusals_of_a_timestamp_drop_the_event(answer: bytes) -> None:
    loop = Loop()
    loop.read("a")
    loop.post(1.0)
    loop.report(BatchAnswered(422, answer))
    assert isinstance(loop.effect(), ReportDropped)
    assert loop.delivery.dropped == 1


@pytest.mark.parametrize("status", [401, 403, 404, 301, 308, 405, 407, 409])
def test_a_configuration_mistake_stalls_without_using_attempts(status: int) -> None:
    loop = Loop(DeliverySettings(max_attempts=1, stall_delay=30.0))
    loop.read("a")
    loop.post(1.0)
    loop.report(BatchAnswered(status))
    assert loop.delivery.stalled == (
        f"Polar answered {status}: check the access token and server URL"
    )
    assert loop.delivery.blocked  # only an operator ends it: a flush would only wait
    assert loop.effect(2.0) == Sleep(31.0)
    loop.report(Done())
    loop.post(31.0)
    loop.report(BatchAnswered(status))  # still no drop, whatever max_attempts says
    assert loop.delivery.dropped == 0
    loop.post(61.0)
    loop.report(BatchAnswered(202))
    assert loop.delivery.stalled is None and not loop.delivery.blocked


def test_a_certificate_that_does_not_verify_stalls_without_using_attempts() -> None:
    loop = Loop(DeliverySettings(max_attempts=1, stall_delay=30.0))
    loop.read("a")
    loop.post(1.0)
    reason = "the TLS certificate of polar did not verify (self-signed certificate)"
    loop.report(BatchFailed(reason, maybe_sent=False, stalls=True))
    assert loop.delivery.stalled == reason and loop.delivery.blocked
    assert loop.effect(2.0) == Sleep(31.0)
    loop.report(Done())
    loop.post(31.0)
    loop.report(BatchFailed(reason, maybe_sent=False, stalls=True))
    assert loop.delivery.dropped == 0
    loop.post(61.0)
    loop.report(BatchAnswered(202))
    assert loop.delivery.stalled is None
    assert [a.script for a in loop.work(1) if isinstance(a, SettleScript)] == ["acknowledge"]


def test_a_stall_is_reported_at_every_refused_attempt_and_not_once_it_ends() -> None:
    loop = Loop(DeliverySettings(stall_delay=30.0))
    loop.read("a")
    loop.post(1.0)
    loop.report(BatchAnswered(401))
    message = (
        "outpost delivery is stalled: Polar answered 401: check the access token and server URL"
    )
    assert loop.delivery.reports() == [Report(logging.ERROR, message)]
    assert loop.delivery.reports() == []  # drained
    loop.post(31.0)
    loop.report(BatchFailed("untrusted", maybe_sent=False, stalls=True))
    assert loop.delivery.reports() == [
        Report(logging.ERROR, "outpost delivery is stalled: untrusted")
    ]
    loop.post(61.0)
    loop.report(BatchAnswered(202))
    assert loop.delivery.reports() == []


def test_unreadable_entries_are_reported_once_per_input() -> None:
    loop = Loop()
    assert isinstance(loop.effect(), ReadOutbox)
    loop.report(OutboxRead([(STREAM, "1-x", {b"e": b"not json"}), (STREAM, "1-y", {})]))
    assert loop.delivery.reports() == [
        Report(logging.WARNING, "outpost removed 2 unreadable outbox entries (or rejected replies)")
    ]


def test_rate_limits_wait_for_retry_after_and_use_no_attempt() -> None:
    loop = Loop(DeliverySettings(max_attempts=1, backoff_base=0.5))
    loop.read("a")
    loop.post(1.0)
    loop.report(BatchAnswered(429, b"", retry_after=7.0))
    assert loop.effect() == Sleep(8.0)
    loop.report(Done())
    loop.post(8.0)
    loop.report(BatchAnswered(429))  # no Retry-After: the backoff of a second wait
    assert loop.effect() == Sleep(8.0 + 1.0 * 0.75)
    assert loop.delivery.rate_limited == 2
    assert loop.delivery.dropped == 0


def test_server_errors_retry_with_backoff_then_drop() -> None:
    loop = Loop(DeliverySettings(max_attempts=4, backoff_base=1.0, backoff_cap=3.0), draw=1.0)
    loop.read("a")
    loop.post(1.0)
    waits = []
    for _ in range(3):
        loop.report(BatchAnswered(500))
        sleep = loop.effect()
        assert isinstance(sleep, Sleep)
        waits.append(sleep.until - loop.now)
        loop.report(Done())
        loop.post(sleep.until)
    assert waits == [1.0, 2.0, 3.0]
    loop.report(BatchAnswered(500))
    assert loop.work(2) == [
        ReportDropped(events=(item("a"),), reason="Polar answered 500, after 4 attempts"),
        settle("acknowledge", ["a"], ["a"]),  # Polar may have stored them before failing
    ]


def test_retry_after_on_a_server_error_is_honoured_when_longer() -> None:
    loop = Loop(DeliverySettings(backoff_base=1.0))
    loop.read("a")
    loop.post(1.0)
    loop.report(BatchAnswered(503, retry_after=10.0))
    assert loop.effect() == Sleep(11.0)
    loop.report(Done())
    loop.post(11.0)
    loop.report(BatchAnswered(503, retry_after=0.1))
    assert loop.effect() == Sleep(11.0 + 2.0 * 0.75)


def second_attempt_after_a_timeout(max_attempts: int) -> Loop:
    """Event a's first attempt timed out (it may have reached Polar); the second is posted."""
    loop = Loop(DeliverySettings(max_attempts=max_attempts))
    loop.read("a")
    loop.post(1.0)
    loop.report(BatchFailed("read timeout", maybe_sent=True))
    loop.post(10.0)
    return loop


def test_a_batch_that_may_have_reached_polar_is_acknowledged_when_dropped() -> None:
    loop = second_attempt_after_a_timeout(max_attempts=2)
    loop.report(BatchAnswered(500))
    assert loop.work(2) == [
        ReportDropped(events=(item("a"),), reason="Polar answered 500, after 2 attempts"),
        settle("acknowledge", ["a"], ["a"]),
    ]


def test_a_batch_refused_for_good_is_confirmed_and_a_failed_one_keeps_counting() -> None:
    # A refusal (4xx about the events) means Polar stored nothing: the events stop counting. A
    # 5xx may come after Polar stored them: they keep counting until a snapshot decides.
    refused = Loop()
    refused.read("a")
    refused.post(1.0)
    refused.report(BatchAnswered(400))
    assert [a.script for a in refused.work(2) if isinstance(a, SettleScript)] == ["confirm"]
    failed = Loop(DeliverySettings(max_attempts=1))
    failed.read("a")
    failed.post(1.0)
    failed.report(BatchAnswered(500))
    assert [a.script for a in failed.work(2) if isinstance(a, SettleScript)] == ["acknowledge"]


@pytest.mark.parametrize(
    "failure",
    [
        BatchAnswered(502),
        BatchAnswered(503),
        BatchAnswered(504),
        BatchAnswered(408),  # the request did not arrive whole: nothing was processed
        BatchAnswered(425),
        BatchFailed("connection refused", maybe_sent=False),
    ],
)
def test_an_outage_waits_as_long_as_it_takes_and_drops_nothing(
    failure: BatchAnswered | BatchFailed,
) -> None:
    loop = Loop(DeliverySettings(max_attempts=1, backoff_base=1.0, backoff_cap=60.0), draw=1.0)
    loop.read("a")
    loop.post(1.0)
    waits = []
    for _ in range(12):
        loop.report(failure)
        sleep = loop.effect()
        assert isinstance(sleep, Sleep)
        waits.append(sleep.until - loop.now)
        loop.report(Done())
        loop.post(sleep.until)
    assert waits[:4] == [1.0, 2.0, 4.0, 8.0] and waits[-1] == 60.0
    assert loop.delivery.dropped == 0
    loop.report(BatchAnswered(200))
    assert [a.script for a in loop.work(1) if isinstance(a, SettleScript)] == ["acknowledge"]


# -- Retry-After ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("0", 0.0),
        ("120", 120.0),
        ("121", 120.0),
        (" 7 ", 7.0),
        ("Wed, 02 Dec 2026 15:00:10 GMT", 5.0),
        ("Wed, 02 Dec 2026 14:00:00 GMT", 0.0),  # in the past: no wait
        ("Wed, 02 Dec 2026 15:00:10 -0000", None),  # no timezone: not a usable date
        ("soon", None),
        ("-5", None),
        ("1.5", None),
        ("", None),
        ("9" * 400, 120.0),  # absurd waits are capped (this one would parse to infinity)
        ("Fri, 31 Dec 9999 23:59:59 GMT", 120.0),
    ],
)
def test_retry_after(header: str | None, expected: float | None) -> None:
    assert retry_after(header, WALL) == expected


def test_retry_after_with_a_superscript_digit_is_ignored() -> None:
    assert retry_after("²", WALL) is None


def test_outbox_entry_shape() -> None:
    entry = OutboxEntry(stream=STREAM, id="1-a", item=b"{}", field="0:a", states=(ST1,))
    assert (entry.stream, entry.id, entry.item, entry.field, entry.states) == (
        STREAM,
        "1-a",
        b"{}",
        "0:a",
        (ST1,),
    )
    assert math.isfinite(DeliverySettings().linger)


def test_a_refusal_after_an_uncertain_attempt_keeps_the_event_counting() -> None:
    # The first attempt may have reached Polar (it timed out); a later 422 for the same event
    # cannot prove Polar does not hold it, so it is settled as acknowledged, not confirmed.
    loop = second_attempt_after_a_timeout(max_attempts=5)
    loop.report(BatchAnswered(422, b'{"detail": [{"loc": ["body", "events", 0, "name"]}]}'))
    assert [a.script for a in loop.work(2) if isinstance(a, SettleScript)] == ["acknowledge"]


def test_settling_can_tell_the_script_which_revisions_are_held() -> None:
    from outpost_core._delivery import with_known_revs

    action = SettleScript(
        script="acknowledge",
        keys=(STREAM, "s1", "s1:acked", "s2", "s2:acked"),
        args=("ch", GROUP, "7", "2", "1-a", "1-b", "-1", "2", "f1", "f2", "-1", "1", "f3"),
    )
    revs = {"s1": 12, "s2": -1}
    told = with_known_revs(action, revs.__getitem__)
    assert told.args == (
        *("ch", GROUP, "7", "2", "1-a", "1-b"),
        *("12", "2", "f1", "f2"),
        *("-1", "1", "f3"),
    )
    assert (told.script, told.keys) == (action.script, action.keys)


def test_nothing_done_is_what_a_closing_instance_reports() -> None:
    from outpost_core import (
        BudgetAnswered,
        CheckHeartbeats,
        ClaimStale,
        ConsumersListed,
        Done,
        HeartbeatsChecked,
        OutboxRead,
        ReadOutbox,
        Reclaim,
        Reclaimed,
        RefreshClaim,
        Settled,
        SettleScript,
        SurveyConsumers,
        TakeRequest,
        nothing_done,
    )

    assert nothing_done(ReadOutbox(count=1, block=0.0)) == OutboxRead([])
    assert nothing_done(ClaimStale(min_idle=1.0, count=1)) == OutboxRead([])
    assert nothing_done(SurveyConsumers()) == ConsumersListed([])
    assert nothing_done(CheckHeartbeats(("a", "b"))) == HeartbeatsChecked([b"1", b"1"])
    assert nothing_done(Reclaim("s", "", 1, ("x",))) == Reclaimed("s", '{"e":[],"d":[]}')
    assert nothing_done(TakeRequest("k", 1, 1)) == BudgetAnswered(0)
    settle = SettleScript(script="acknowledge", keys=("s",), args=("a",))
    assert nothing_done(settle) == Settled(None)
    assert nothing_done(RefreshClaim(())) == Done()


# -- the deployment's shard count ------------------------------------------------------------


def test_a_loop_of_64_shards_delivers_and_settles_the_entries_of_shard_40() -> None:
    wide = keys.outbox_key(40)
    loop = Loop(DeliverySettings(shards=64))
    assert isinstance(loop.effect(), ReadOutbox)
    loop.report(OutboxRead(entries("a", stream=wide)))
    assert loop.delivery.rejected_entries == 0
    assert loop.post(1.0) == PostBatch(body=body("a"), size=1)
    loop.report(BatchAnswered(200))
    [acknowledge] = loop.work(1)
    assert acknowledge.keys[0] == wide
    assert acknowledge.args[:2] == (keys.channel(40), GROUP)


def test_a_loop_of_16_shards_takes_no_entry_of_a_stream_beyond_them() -> None:
    loop = Loop()
    assert isinstance(loop.effect(), ReadOutbox)
    loop.report(OutboxRead([*entries("x", stream=keys.outbox_key(40)), *entries("ok")]))
    assert loop.delivery.rejected_entries == 1  # not one of its streams: not even removed
    assert loop.post(1.0) == PostBatch(body=body("ok"), size=1)


def test_delivery_settings_refuse_a_shard_count_out_of_range() -> None:
    with pytest.raises(ConfigurationError, match="shards must be from 1 to 1024, not 0"):
        DeliverySettings(shards=0)
