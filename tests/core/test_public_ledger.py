"""The public-mode ledger: anchors on Polar's customer meter, prunes only what Polar's figure
provably includes, and never reads above Polar's balance (nor, under its assumptions, above the
true one)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outpost_core._public_ledger import MeterLedger, Outcome
from outpost_core._public_readings import PolarReading
from outpost_core.errors import UsageError
from tests.core._polar_public import PolarMeter, S

MARGIN = 60 * S


def reading(consumed: float, credited: int, at_s: float | None) -> PolarReading:
    at = None if at_s is None else int(at_s * S)
    return PolarReading("c1", None, "m1", consumed, credited, credited - consumed, at)


def ledger(aggregation: str = "sum") -> MeterLedger:
    return MeterLedger(aggregation, margin_us=MARGIN)


def acknowledged_e1(
    aggregation: str, anchor: PolarReading, acknowledged_s: int, value: float = 1.0
) -> MeterLedger:
    """A ledger anchored on Polar's ``anchor`` that recorded e1, acknowledged at that second."""
    book = ledger(aggregation)
    book.observe(anchor)
    book.record("e1", value)
    book.acknowledged(["e1"], acknowledged_s * S)
    return book


def test_no_balance_before_polar_reported() -> None:
    book = ledger()
    book.record("e1", 3)
    assert book.balance().balance is None
    assert book.balance().pending == 0


def test_misuse_raises() -> None:
    with pytest.raises(UsageError):
        MeterLedger("median")
    with pytest.raises(UsageError):
        MeterLedger("sum", margin_us=-1)
    with pytest.raises(UsageError):
        ledger("unique").record("e1")


def test_pending_events_count_until_polar_provably_includes_them() -> None:
    book = ledger()
    assert book.observe(reading(0, 100, 1000)) is Outcome.FIRST
    book.record("e1", 5)
    book.record("e1", 5)  # the same event again changes nothing
    book.record("e2", -4)  # a negative value counts as 0
    assert book.balance().balance == 95
    book.acknowledged(["e1", "e2", "unknown"], 1010 * S)
    book.acknowledged(["e1"], 1500 * S)  # a later 2xx (a retry) does not move the first
    # Recomputed at 1060 s: the watermark (1000 s) is before the acknowledgement.
    assert book.observe(reading(5, 100, 1060)) is Outcome.ACCEPTED
    assert set(book.entries) == {"e1", "e2"}  # not provably included: they stay
    # Polar's consumed rose by 5 and only the ledger's e1 can make it up: not counted twice.
    assert book.balance().balance == 95
    assert book.observe(reading(5, 100, 1071)) is Outcome.ACCEPTED  # watermark 1011 s
    assert book.balance().balance == 95
    assert book.entries == {}


def test_a_grant_recounting_fresh_events_does_not_count_them_twice() -> None:
    book = ledger("count")
    book.observe(reading(0, 2, 1000))
    book.record("e1")
    book.record("e2")
    book.acknowledged(["e1", "e2"], 1001 * S)
    assert book.balance().balance == 0
    # A grant of 1 recomputes at once: its figure counts e1 and e2, acknowledged just before.
    assert book.observe(reading(2, 3, 1002)) is Outcome.ACCEPTED
    assert len(book.entries) == 2 and book.cap == 0
    assert book.balance().balance == 1
    book.record("e3")  # in flight: it counts at once
    assert book.balance().balance == 0
    # A later figure drops what its watermark covers; the basis follows Polar's again.
    book.acknowledged(["e3"], 1003 * S)
    assert book.observe(reading(3, 3, 1100)) is Outcome.ACCEPTED
    assert book.entries == {} and book.cap == 3
    assert book.balance().balance == 0


def test_the_cap_never_lifts_the_balance_above_polars() -> None:
    book = acknowledged_e1("count", reading(0, 100, 1000), 1001)
    book.record("e2")  # in flight
    # Usage from elsewhere (9 units): more than the ledger holds.
    assert book.observe(reading(10, 100, 1002)) is Outcome.ACCEPTED
    assert book.cap == 9  # Polar's 10 less the acknowledged e1, not 0 + nothing dropped
    assert book.balance().balance == 100 - 10 - 1  # Polar's 90, less e2 still in flight
    book.acknowledged(["e2"], 1003 * S)
    assert book.balance().balance == 89


def test_a_reset_or_a_max_meter_has_no_cap() -> None:
    book = acknowledged_e1("count", reading(5, 100, 1000), 1001)
    assert book.observe(reading(6, 100, 1002)) is Outcome.ACCEPTED and book.cap == 5
    assert book.observe(reading(0, 100, 1003)) is Outcome.RESET and book.cap is None
    highest = acknowledged_e1("max", reading(5, 100, 1000), 1001, 7)
    assert highest.observe(reading(7, 100, 1002)) is Outcome.ACCEPTED and highest.cap is None
    # No watermark: the first reading's consumed bounds nothing.
    first = acknowledged_e1("count", reading(0, 100, None), 1001)
    assert first.observe(reading(1, 100, 1002)) is Outcome.ACCEPTED and first.cap is None
    assert first.balance().balance == 98


def test_activation_moves_modified_at_without_the_events() -> None:
    book = acknowledged_e1("count", reading(0, 10, None), 1000)
    # The row is activated at 2000 s: modified_at moves, consumed stays 0.
    assert book.observe(reading(0, 10, 2000)) is Outcome.REJECTED
    assert book.rejections == 1
    assert book.balance().balance == 9
    assert book.observe(reading(1, 10, 2015)) is Outcome.ACCEPTED
    assert book.balance().balance == 9 and book.entries == {}


def test_late_and_repeated_readings_are_ignored() -> None:
    book = ledger()
    book.observe(reading(10, 100, 2000))
    assert book.observe(reading(5, 100, 1000)) is Outcome.STALE  # older: not a reset
    assert book.observe(reading(10, 100, 2000)) is Outcome.STALE  # the same row version
    assert book.observe(reading(0, 0, None)) is Outcome.STALE
    assert book.balance().polar_balance == 90


def test_first_reading_without_modified_at_anchors() -> None:
    book = ledger()
    assert book.observe(reading(0, 0, None)) is Outcome.NO_WATERMARK
    book.record("e1", 2)
    assert book.balance().balance == -2
    # A never-updated row that somehow reports usage, then less: a reset with no floor known.
    odd = acknowledged_e1("sum", reading(5, 10, None), 1000, 1)
    assert odd.observe(reading(1, 10, 2000)) is Outcome.RESET
    assert odd.entries == {}  # the check passed on the new window


def test_reset_drops_what_was_acknowledged_before_it() -> None:
    book = ledger("count")
    book.observe(reading(0, 100, 1000))
    for n in range(3):
        book.record(f"old{n}")
    book.acknowledged(["old0", "old1"], 1100 * S)
    book.acknowledged(["old2"], 1990 * S)
    book.observe(reading(2, 100, 2000))  # old0, old1 included, old2 not yet
    book.record("new")
    book.acknowledged(["new"], 3000 * S)
    # A cycle at 3100 s: consumed falls; old2 was acknowledged after the last old-window
    # reading less the margin, so it may be either side: it is kept, counted twice at worst.
    assert book.observe(reading(0, 50, 3100)) is Outcome.RESET
    assert set(book.entries) == {"old2", "new"}
    assert book.carried == {"old2", "new"}
    assert book.balance().balance == 48
    # Later readings check only what came after the reset.
    book.record("n2")
    book.acknowledged(["n2"], 3200 * S)
    assert book.observe(reading(2, 50, 3300)) is Outcome.ACCEPTED
    assert set(book.entries) == {"old2", "new"}  # carried until the next reset
    assert book.observe(reading(0, 40, 9000)) is Outcome.RESET
    assert book.entries == {} and book.carried == set()


def test_reset_with_a_known_instant_and_a_passing_check() -> None:
    book = ledger("count")
    book.observe(reading(3, 100, 1000))
    book.record("old")
    book.acknowledged(["old"], 1500 * S)
    book.record("new")
    book.acknowledged(["new"], 2100 * S)
    book.reset_seen(2000 * S + MARGIN)  # the reset's instant: "old" was before it
    assert book.observe(reading(1, 50, 2200)) is Outcome.RESET
    assert book.entries == {} and book.carried == set()  # "new" passed the check
    assert book.observe(reading(2, 50, 2300)) is Outcome.ACCEPTED
    book.record("after")
    book.acknowledged(["after"], 2400 * S)
    assert book.observe(reading(1, 50, 2500)) is Outcome.RESET
    assert book.entries == {} and book.baseline == 0


def test_discard_forgets_refused_events() -> None:
    book = ledger()
    book.observe(reading(0, 10, 1000))
    book.record("bad", 3)
    book.discard(["bad", "unknown"])
    assert book.balance().balance == 10


def test_max_meter() -> None:
    book = ledger("max")
    book.observe(reading(4, 10, 1000))
    book.record("a", 3)
    assert book.balance().balance == 6  # 3 is below Polar's max
    book.record("b", 9)
    assert book.balance().balance == 1
    book.acknowledged(["a", "b"], 1100 * S)
    assert book.observe(reading(5, 10, 1200)) is Outcome.REJECTED  # 9 is not in it yet
    assert book.observe(reading(9, 10, 1300)) is Outcome.ACCEPTED
    assert book.balance().balance == 1


def test_unique_meter() -> None:
    book = ledger("unique")
    book.observe(reading(2, 10, 1000))
    book.record("a", key="x")
    book.record("b", key="x")
    book.record("c", key="y")
    assert book.balance().balance == 6
    book.acknowledged(["a", "b", "c"], 1100 * S)
    assert book.observe(reading(1, 10, 1200)) is Outcome.RESET
    assert book.observe(reading(3, 10, 1300)) is Outcome.ACCEPTED
    assert book.balance().balance == 7


@pytest.mark.parametrize("aggregation", ["avg", "min"])
def test_avg_and_min_are_relayed_and_approximate(aggregation: str) -> None:
    book = ledger(aggregation)
    assert book.balance().approximate
    book.observe(reading(4, 10, 1000))
    book.record("e1", 100)
    answer = book.balance()
    assert (answer.balance, answer.approximate, answer.pending) == (6, True, 0)
    assert book.observe(reading(3, 10, 1100)) is Outcome.RESET


def test_a_probe_that_cannot_be_used_changes_nothing() -> None:
    book = ledger("count")
    assert book.observe_probe(5, 1000 * S, 5 * S) is Outcome.PROBE_UNUSED  # no anchor yet
    book.observe(reading(4, 100, 1000))
    book.record("e1")
    book.acknowledged(["e1"], 1010 * S)
    # Not newer than the anchor: its watermark (sent - lag) is not after the anchor's.
    assert book.observe_probe(5, 945 * S, 5 * S) is Outcome.PROBE_UNUSED
    assert book.observe_probe(3, 1100 * S, 5 * S) is Outcome.PROBE_UNUSED  # below the anchor's
    # Above the anchor's 4 plus the one event Outpost holds: an earlier window's usage.
    assert book.observe_probe(6, 1100 * S, 5 * S) is Outcome.PROBE_UNUSED
    assert (book.probe, book.balance().balance, set(book.entries)) == (None, 95, {"e1"})
    assert ledger("max").observe_probe(1, 1, 0) is Outcome.PROBE_UNUSED


def test_a_probe_re_anchors_consumed_and_drops_what_it_includes() -> None:
    book = ledger("count")
    book.observe(reading(0, 100, 1000))
    for name, acked in (("old", 1100), ("late", 1198), ("flying", None)):
        book.record(name)
        if acked is not None:
            book.acknowledged([name], acked * S)
    # Sent at 1200 s with 5 s of replica lag: "old" is in it, "late" may not be.
    assert book.observe_probe(1, 1200 * S, 5 * S) is Outcome.PROBED
    assert set(book.entries) == {"late", "flying"}
    answer = book.balance()
    assert (answer.balance, answer.polar_balance, answer.pending) == (97, 100, 3)
    assert book.consumed_basis() == 1 and book.baseline == 1
    # An older probe, then a newer one whose rise does not cover what it would drop.
    assert book.observe_probe(1, 1150 * S, 5 * S) is Outcome.PROBE_UNUSED
    assert book.observe_probe(1, 1300 * S, 5 * S) is Outcome.PROBE_REJECTED
    assert (book.rejections, set(book.entries)) == (1, {"late", "flying"})
    # A reading that does not cover the probe keeps it (and its credits count).
    assert book.observe(reading(2, 120, 1320)) is Outcome.ACCEPTED
    assert book.probe is not None and book.balance().balance == 120 - 2 - 1
    # One that covers it (1370 - 60 >= 1300 - 5) takes over.
    assert book.observe(reading(3, 120, 1370)) is Outcome.ACCEPTED
    assert book.probe is None and book.balance().balance == 120 - 3 - 1


def test_a_reading_below_a_probe_it_does_not_cover_keeps_the_probe_consumed() -> None:
    book = acknowledged_e1("count", reading(0, 100, 1000), 1100)
    book.record("e2")
    assert book.observe_probe(2, 1200 * S, 0) is Outcome.PROBED  # (e2 of another producer)
    assert book.observe(reading(1, 100, 1210)) is Outcome.ACCEPTED
    # The probe's 2 beyond its drop of e1 can only be e2 (all usage goes through Outpost).
    assert book.balance().balance == 100 - 1 - 1


def test_a_reset_keeps_a_probe_it_does_not_cover() -> None:
    book = acknowledged_e1("sum", reading(5, 100, 1000), 1900, 3)
    assert book.observe_probe(8, 2000 * S, 0) is Outcome.PROBED
    # The cycle's reading comes right after: what the probe dropped may be of the new window.
    assert book.observe(reading(0, 50, 2010)) is Outcome.RESET
    assert book.probe is not None and book.balance().balance == 50 - 8
    assert book.observe(reading(2, 50, 2100)) is Outcome.ACCEPTED
    assert book.probe is None and book.balance().balance == 48


def test_a_reading_that_says_when_the_window_began_starts_a_window() -> None:
    book = ledger()
    first = reading(0, 100, None)
    assert book.observe(attrs.evolve(first, reset_at_us=500 * S)) is Outcome.NO_WATERMARK
    assert book.reset_hint_us == 500 * S
    book.record("old", 5)
    book.acknowledged(["old"], 1010 * S)
    assert book.observe(reading(5, 100, 1100)) is Outcome.ACCEPTED
    book.record("new", 4)
    book.acknowledged(["new"], 1200 * S)
    cycle = attrs.evolve(reading(6, 50, 1300), reset_at_us=1150 * S)
    assert book.observe(attrs.evolve(cycle, modified_at_us=900 * S)) is Outcome.STALE
    assert book.reset_hint_us == 500 * S  # a stale reading teaches nothing
    assert book.observe(cycle) is Outcome.RESET
    assert book.entries == {} and book.balance().balance == 44
    older = attrs.evolve(reading(7, 50, 1400), reset_at_us=600 * S)
    assert book.observe(older) is Outcome.ACCEPTED and book.reset_hint_us == 1150 * S


def test_a_known_reset_instant_after_the_anchor_starts_a_window() -> None:
    book = ledger()
    book.observe(reading(0, 100, 1000))
    book.record("old", 5)
    book.acknowledged(["old"], 1010 * S)
    assert book.observe(reading(5, 100, 1100)) is Outcome.ACCEPTED
    book.record("new", 4)
    book.acknowledged(["new"], 1200 * S)
    book.reset_seen(1150 * S)
    # Consumed did not fall (the new window used more already), yet the cycle came between:
    # the new window is checked from 0, not from what the old one dropped.
    assert book.observe(reading(6, 50, 1300)) is Outcome.RESET
    assert book.entries == {} and book.balance().balance == 44
    # A known instant the anchor is already past starts nothing.
    assert book.observe(reading(7, 50, 1400)) is Outcome.ACCEPTED


# Adversarial runs against a model of Polar -------------------------------------------------

OPS = st.one_of(
    st.tuples(st.just("track"), st.integers(0, 5)),
    st.tuples(st.just("commit"), st.booleans()),  # bool: the 2xx is lost (acked on retry)
    st.tuples(st.just("retry"), st.just(0)),
    st.tuples(st.just("advance"), st.integers(1, 4 * 3600)),
    st.tuples(st.just("recompute"), st.integers(0, 30)),
    st.tuples(st.just("activate"), st.just(0)),
    st.tuples(st.just("grant"), st.integers(0, 50)),
    st.tuples(st.just("revoke"), st.integers(1, 50)),
    st.tuples(st.just("cycle"), st.integers(0, 100)),
    st.tuples(st.just("deliver"), st.integers(0, 10**6)),
    st.tuples(st.just("deliver_newest"), st.just(0)),
    st.tuples(st.just("probe"), st.integers(0, 20)),
    st.tuples(st.just("advance"), st.integers(1, 30)),
)
PROBE_LAG = 5 * S


def run(aggregation: str, ops: list[tuple[str, int]], skew_s: int, unseen_revokes: bool) -> None:
    polar = PolarMeter(aggregation, skew_us=skew_s * S)
    book = MeterLedger(aggregation, margin_us=MARGIN)
    flying: list[tuple[str, float]] = []
    unacked: list[str] = []
    count = 0
    for op, arg in ops:
        if op == "track":
            count += 1
            value = 1.0 if aggregation == "count" else float(arg)
            book.record(f"e{count}", value)
            flying.append((f"e{count}", value))
        elif op == "commit" and flying:
            event_id, value = flying.pop(0)
            polar.commit(value)
            polar.tick(arg * S)
            if arg:
                unacked.append(event_id)  # the 2xx is lost; Polar has the row
            else:
                book.acknowledged([event_id], polar.outpost_now())
        elif op == "retry" and unacked:
            book.acknowledged(unacked, polar.outpost_now())  # a duplicate, acknowledged
            unacked.clear()
        elif op == "advance":
            polar.tick(arg * S)
        elif op == "recompute":
            polar.recompute(gap_us=arg * S)
        elif op == "activate":
            polar.activate()
        elif op == "grant":
            polar.grant(arg)
        elif op == "revoke" and unseen_revokes:
            polar.grant(-arg)
        elif op == "cycle":
            polar.cycle(arg)
        elif op == "deliver" and polar.readings:
            book.observe(polar.readings[arg % len(polar.readings)])
        elif op == "deliver_newest" and polar.readings:
            book.observe(polar.readings[-1])
        elif op == "probe":  # a replica `arg` s behind, against a margin of PROBE_LAG
            sent = polar.outpost_now()
            book.observe_probe(polar.probe(lag_us=arg * S), sent, PROBE_LAG)
        local = book.balance()
        if local.balance is None:
            continue
        anchor = book.anchor
        assert anchor is not None
        assert local.balance <= anchor.balance  # never above what Polar last reported
        # Above the truth only by a credit decrease Outpost has not seen yet.
        unseen = max(0, anchor.credited - polar.true_credited())
        assert local.balance <= polar.true_balance() + unseen + 1e-9


@settings(max_examples=300, deadline=None)
@given(
    aggregation=st.sampled_from(["count", "sum", "max"]),
    ops=st.lists(OPS, max_size=80),
    skew_s=st.integers(-20, 20),
)
def test_never_above_polar_nor_the_truth(
    aggregation: str, ops: list[tuple[str, int]], skew_s: int
) -> None:
    run(aggregation, ops, skew_s, unseen_revokes=True)


def test_recompute_delayed_to_the_180_minute_bound() -> None:
    """Continuous traffic: Polar recomputes once in 180 minutes; the ledger carries it all."""
    ops: list[tuple[str, int]] = [("grant", 0), ("deliver_newest", 0)]
    for _ in range(180):
        ops += [("track", 1), ("commit", 0), ("advance", 60)]
    ops += [("recompute", 0), ("deliver_newest", 0)]
    run("count", ops, skew_s=5, unseen_revokes=False)


def test_a_lagging_replica_drops_nothing_it_missed() -> None:
    """The replica lags 20 s, the margin says 5: the probe misses an event acknowledged 10 s
    before it, and its check keeps that event counted."""
    ops: list[tuple[str, int]] = [("grant", 10), ("deliver_newest", 0), ("track", 1)]
    ops += [("commit", 0), ("advance", 10), ("probe", 20), ("advance", 3600)]
    run("count", ops, skew_s=0, unseen_revokes=False)


def test_a_reading_that_misses_what_a_probe_dropped_keeps_the_probe() -> None:
    """A recompute that read usage 20 s before its stamp comes after a probe that dropped an
    event acknowledged 10 s before the probe: the probe's consumed stays."""
    ops: list[tuple[str, int]] = [("grant", 10), ("deliver_newest", 0), ("track", 1)]
    ops += [("commit", 0), ("advance", 10), ("probe", 0), ("recompute", 20)]
    ops += [("deliver_newest", 0), ("advance", 30)]
    run("count", ops, skew_s=0, unseen_revokes=False)


def test_a_late_reset_reading_keeps_what_came_after_it() -> None:
    """The cycle's webhook arrives after new usage was acknowledged: that usage stays."""
    ops: list[tuple[str, int]] = [("grant", 100), ("track", 1), ("commit", 0), ("advance", 60)]
    ops += [("recompute", 0), ("deliver_newest", 0), ("cycle", 50)]
    ops += [("track", 3), ("commit", 0), ("advance", 600), ("track", 2), ("commit", 0)]
    ops += [("deliver", 2), ("advance", 3600)]  # readings: grant, recompute, cycle
    run("sum", ops, skew_s=0, unseen_revokes=False)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.sampled_from(
            [("track", 2), ("commit", 0), ("commit", 1), ("retry", 0), ("advance", 30),
             ("advance", 900), ("recompute", 0), ("recompute", 20), ("cycle", 40),
             ("deliver", 7), ("deliver", 3), ("deliver_newest", 0), ("activate", 0),
             ("probe", 0), ("probe", 8)]
        ),
        max_size=60,
    ),
    skew_s=st.integers(-20, 20),
)  # fmt: skip
def test_cycles_with_late_and_reordered_readings(ops: list[tuple[str, int]], skew_s: int) -> None:
    run("sum", ops, skew_s, unseen_revokes=False)


def _gaps(rate_per_s: int, burst_s: int, quiet_s: int, margin_s: int) -> list[float]:
    """How far below Polar's true balance the ledger reads, second by second, when a customer
    uses `rate_per_s` units a second in bursts and Polar recomputes 15 s after each burst."""
    polar = PolarMeter("count")
    book = MeterLedger("count", margin_us=margin_s * S)
    book.observe(polar.grant(10**6))
    gaps: list[float] = []
    n = 0
    for _ in range(3):
        for _ in range(burst_s * rate_per_s):
            n += 1
            book.record(f"e{n}")
            polar.commit(1.0)
            polar.tick(300_000)  # the 2xx comes 0.3 s later
            book.acknowledged([f"e{n}"], polar.outpost_now())
            polar.tick(S // rate_per_s - 302_000)
            local = book.balance().balance
            assert local is not None
            gaps.append(polar.true_balance() - local)
        polar.tick(15 * S)
        reading = polar.recompute()
        polar.tick(2 * S)  # the webhook's debounce and delivery
        book.observe(reading)
        for _ in range(quiet_s):
            polar.tick(S)
            local = book.balance().balance
            assert local is not None
            gaps.append(polar.true_balance() - local)
    return gaps


@pytest.mark.parametrize(
    ("rate", "burst_s", "margin_s"), [(2, 30, 60), (2, 120, 60), (10, 60, 60), (10, 60, 10)]
)
def test_how_far_below_the_truth(rate: int, burst_s: int, margin_s: int) -> None:
    """The usage acknowledged within the margin before a recompute stays in the ledger until
    the next one, but the cap keeps it from counting twice: once acknowledged, the balance is
    Polar's true balance (docs/public-mode.md)."""
    gaps = _gaps(rate, burst_s, 120, margin_s)
    assert min(gaps) >= 0
    assert max(gaps) == 0


def test_without_the_cap_the_margin_counts_usage_twice() -> None:
    """What the cap saves: the same bursts with every cap dropped read up to rate x (margin -
    quiet time before the recompute) below the truth."""
    original = MeterLedger._carry_cap
    try:
        MeterLedger._carry_cap = lambda self, before: None  # type: ignore[method-assign]
        assert max(_gaps(10, 60, 120, 60)) == pytest.approx(450, abs=10)
    finally:
        MeterLedger._carry_cap = original  # type: ignore[method-assign]
