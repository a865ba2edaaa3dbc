"""The telemetry policy (``outpost_core._telemetry``), without OpenTelemetry."""

from __future__ import annotations

import math

import pytest

from outpost_core import (
    CannotAdmit,
    InsufficientBalance,
    InvalidEvent,
    NotReady,
    RedisUnavailable,
    UnknownMeter,
    UnsupportedMeter,
    admission_outcome,
)
from outpost_core import semconv as s
from outpost_core._observations import LinkChanged, SnapshotApplied
from outpost_core._telemetry import (
    CONNECTION,
    RECONNECTION,
    ReadKey,
    Recorder,
    SpanDone,
    SpanEnded,
    SpanStarted,
    customer_attribute,
    read_outcome,
    track_outcome,
)


def test_outcomes() -> None:
    assert track_outcome(None) == s.OK
    assert track_outcome(InvalidEvent("x")) == s.INVALID
    assert track_outcome(NotReady("x")) == s.NOT_READY
    assert track_outcome(RedisUnavailable("x")) == s.REDIS_ERROR
    assert track_outcome(KeyboardInterrupt()) is None
    assert read_outcome(None) == s.COLD
    assert read_outcome(UnknownMeter("x")) == s.UNKNOWN_METER
    assert read_outcome(UnsupportedMeter("x")) == s.UNSUPPORTED_METER
    assert read_outcome(RedisUnavailable("x")) == s.NOT_READY


def test_customer_attribute() -> None:
    assert customer_attribute("acme", None) == "external:acme"
    assert customer_attribute(None, "c1") == "customer:c1"
    assert customer_attribute(3, 4) == "customer:"  # a rejected call's bad arguments


def test_warm_reads_are_one_counter_record_per_read() -> None:
    drained = Recorder().drain(0.0, 0, 0, {("m", "acme", None): 3, ("m", None, "c1"): 0})
    assert [(w.value, dict(w.attributes)) for w in drained.warm] == [
        (3, {s.METER: "m", s.CUSTOMER: "external:acme"})
    ]
    assert Recorder().drain(0.0, 0, 0).warm == ()


def test_timed_records_carry_their_attributes_and_are_bounded() -> None:
    r = Recorder(cap=1)  # per buffer
    r.read(("m", None, "c1"), 2_000_000, s.COLD)
    r.tracked("acme", None, ("m", "n"), 1_000_000, s.OK, 2)
    r.tracked("acme", None, ("m", "n"), 1_000_000, s.OK, 2)  # over the cap: counted
    r.read(("m", None, "c1"), 1, s.COLD)  # over the cap too
    drained = r.drain(0.0, 0, 0)
    assert drained.overflow == 2
    assert [(x.value, dict(x.attributes)) for x in drained.reads] == [
        (0.002, {s.METER: "m", s.CUSTOMER: "customer:c1", s.OUTCOME: s.COLD})
    ]
    assert [x.attributes[s.METER] for x in drained.ingests] == ["m", "n"]  # one per meter
    assert all(x.value == 0.001 for x in drained.ingests)
    assert [(b.value, dict(b.attributes)) for b in drained.buckets] == [
        (2, {s.CUSTOMER: "external:acme", s.METERS: ("m", "n")})  # hashable
    ]
    assert r.drain(0.5, 0, 0).overflow == 0


def test_admissions_carry_operation_outcome_and_each_meter_and_are_bounded() -> None:
    r = Recorder(cap=2)
    r.admitted(s.RESERVE, "acme", None, ("m",), 3_000_000, s.OK)
    r.admitted(s.TRACK, None, "c1", ("m", "n"), 1_000_000, s.INSUFFICIENT_BALANCE)
    r.admitted(s.COMMIT, "acme", None, (), 1, s.NOT_READY)  # over the cap: counted
    drained = r.drain(0.0, 0, 0)
    assert drained.overflow == 1
    assert [(x.value, dict(x.attributes)) for x in drained.admissions] == [
        (
            0.003,
            {s.METER: "m", s.CUSTOMER: "external:acme", s.OPERATION: s.RESERVE, s.OUTCOME: s.OK},
        ),
        *[
            (
                0.001,
                {
                    s.METER: meter,
                    s.CUSTOMER: "customer:c1",
                    s.OPERATION: s.TRACK,
                    s.OUTCOME: s.INSUFFICIENT_BALANCE,
                },
            )
            for meter in ("m", "n")
        ],
    ]


def test_an_admission_s_outcome_names_why_it_was_refused() -> None:
    assert admission_outcome(None) == s.OK
    assert admission_outcome(InsufficientBalance("m", 1, 0, 0)) == s.INSUFFICIENT_BALANCE
    assert admission_outcome(CannotAdmit("split")) == s.CANNOT_ADMIT
    assert admission_outcome(RedisUnavailable("down")) == s.REDIS_ERROR
    assert admission_outcome(KeyboardInterrupt()) is None  # nothing Outpost's names describe


def test_a_failed_track_records_no_meter_and_no_bucket() -> None:
    r = Recorder()
    r.tracked(None, "c1", (), 5, s.INVALID)
    r.tracked(None, "c1", (), 5, s.INVALID)
    drained = r.drain(0.0, 0, 0)
    assert [x.attributes[s.METER] for x in drained.ingests] == ["", ""]
    assert drained.buckets == ()


def test_buckets_are_summed_per_customer_and_meters() -> None:
    r = Recorder()
    for _ in range(3):
        r.tracked("acme", None, ("m",), 5, s.OK, 1)
    assert [b.value for b in r.drain(0.0, 0, 0).buckets] == [3]


def test_drains_are_due_once_a_second() -> None:
    r = Recorder()
    assert r.due(0.0)
    r.drain(0.0, 0, 0)
    assert not r.due(0.5)
    assert r.due(1.0)


def test_syncs_are_reported_as_deltas_once_per_interval_when_they_changed() -> None:
    r = Recorder(export_interval=30.0)
    assert r.drain(0.0, 0, 0).spans == ()  # nothing yet
    first = r.drain(1.0, 3, 2).spans
    assert first == (SpanDone(s.SPAN_SYNCS, {s.RECEIVED: 3, s.APPLIED: 2}),)
    assert r.drain(2.0, 5, 5).spans == ()  # within the interval
    assert r.drain(31.0, 5, 5).spans == (SpanDone(s.SPAN_SYNCS, {s.RECEIVED: 2, s.APPLIED: 3}),)
    assert r.drain(32.0, 6, 6, force=True).spans[0].attributes == {s.RECEIVED: 1, s.APPLIED: 1}


def test_a_snapshot_is_one_finished_span() -> None:
    seen = SnapshotApplied("external:acme", "snap", 10, 4, ("m",), (math.nan,), (2.0,))
    [op] = Recorder().observe([seen])
    assert isinstance(op, SpanDone) and op.name == s.SPAN_SNAPSHOT
    assert op.attributes[s.METER] == "m"
    assert op.attributes[s.LOCAL_CONSUMED] == [-1.0]
    two = SnapshotApplied("external:acme", "snap", 10, 4, ("m", "n"), (1.0, 2.0), (2.0, 3.0))
    [op] = Recorder().observe([two])
    assert isinstance(op, SpanDone) and s.METER not in op.attributes


def test_link_spans_connection_then_reconnection() -> None:
    r = Recorder()
    opened = r.observe([LinkChanged("open", connections=1)])
    assert opened == [SpanStarted(CONNECTION, s.SPAN_CONNECTION, {"outpost.attempt": 1})]
    closed = r.observe([LinkChanged("closed", reason="gone")])
    assert closed == [
        SpanEnded(CONNECTION, {s.REASON: "gone"}),
        SpanStarted(RECONNECTION, s.SPAN_RECONNECTION, {s.REASON: "gone"}),
    ]
    assert r.observe([LinkChanged("closed")]) == []  # still reconnecting: one span
    reopened = r.observe([LinkChanged("open", connections=2)])
    assert reopened[0] == SpanEnded(RECONNECTION, {s.OUTCOME: s.OK})
    assert isinstance(reopened[1], SpanStarted)
    # An open without a close between ends the connection span it replaces.
    again = r.observe([LinkChanged("open", connections=3)])
    assert again[0] == SpanEnded(CONNECTION, {})
    assert r.close() == [SpanEnded(CONNECTION, {})]
    assert r.close() == []


def test_closing_ends_a_reconnection_too() -> None:
    r = Recorder()
    r.observe([LinkChanged("closed", reason="refused")])
    assert r.close() == [SpanEnded(RECONNECTION, {})]


def test_an_interval_admits_at_most_the_cap_of_series_per_instrument_and_counts_the_rest() -> None:
    r = Recorder(export_interval=30.0, series_cap=2)
    assert r.series_cap == 2
    for customer in ("a", "b", "c"):
        r.read(("m", customer, None), 1, s.COLD)
        r.tracked(customer, None, ("m",), 1, s.OK, 1)
    r.read(("m", "a", None), 1, s.COLD)  # a series already admitted: kept
    warm: dict[ReadKey, int] = {("m", "a", None): 1, ("m", "b", None): 1, ("m", "c", None): 1}
    first = r.drain(0.0, 0, 0, warm)
    customers = [x.attributes[s.CUSTOMER] for x in first.reads]
    assert customers == ["external:a", "external:b", "external:a"]
    assert [x.attributes[s.CUSTOMER] for x in first.ingests] == ["external:a", "external:b"]
    assert len(first.buckets) == len(first.warm) == 2
    assert (first.export, first.left_out) == (False, 0)  # the interval goes on
    # Later in the same interval: a new series is still beyond the cap, an admitted one is not.
    r.read(("m", "d", None), 1, s.COLD)
    r.read(("m", "b", None), 1, s.COLD)
    second = r.drain(29.0, 0, 0)
    assert [x.attributes[s.CUSTOMER] for x in second.reads] == ["external:b"]
    assert (second.export, second.left_out) == (False, 0)
    # The drain that ends the interval exports it, with what the cap left out (c's read, track,
    # bucket and warm reads, then d's and e's reads), and the next interval starts empty.
    r.read(("m", "e", None), 1, s.COLD)
    ending = r.drain(30.0, 0, 0)
    assert (ending.export, ending.left_out) == (True, 6)
    assert [x.attributes[s.CUSTOMER] for x in ending.reads] == []
    r.read(("m", "c", None), 1, s.COLD)
    r.read(("m", "d", None), 1, s.COLD)
    after = r.drain(31.0, 0, 0)
    assert [x.attributes[s.CUSTOMER] for x in after.reads] == ["external:c", "external:d"]
    assert (after.export, after.left_out) == (False, 0)
    closing = r.drain(32.0, 0, 0, force=True)  # a close ends the interval at once
    assert (closing.export, closing.left_out) == (True, 0)


def test_a_cap_below_one_series_is_refused() -> None:
    with pytest.raises(ValueError, match="series_cap"):
        Recorder(series_cap=0)
