"""The telemetry policy (``outpost_core._telemetry``), without OpenTelemetry."""

from __future__ import annotations

import math

from outpost_core import InvalidEvent, NotReady, RedisUnavailable, UnknownMeter, UnsupportedMeter
from outpost_core import semconv as s
from outpost_core._observations import LinkChanged, SnapshotApplied
from outpost_core._telemetry import (
    CONNECTION,
    RECONNECTION,
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
        (2, {s.CUSTOMER: "external:acme", s.METERS: ["m", "n"]})
    ]
    assert r.drain(0.5, 0, 0).overflow == 0


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
