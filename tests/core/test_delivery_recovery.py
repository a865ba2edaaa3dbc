"""One instance's rule for Redis failures of its delivery loops and for re-reads of this
consumer's pending entries (``_delivery_recovery``)."""

from __future__ import annotations

import logging

import pytest

from outpost_core import BackOff, DeliveryRecovery, GiveUp, RecreateGroups, Report, UsageError


def failed(recovery: DeliveryRecovery, loop: int = 0, now: float = 100.0) -> object:
    return recovery.failed(loop, now, "Connection refused", 1.0, lost_data=False, closing=False)


def test_nothing_is_due_before_any_failure() -> None:
    recovery = DeliveryRecovery()
    assert recovery.next_read(all_idle=True) == "no"
    assert recovery.failures == 0


def test_a_failure_in_one_loop_has_a_loop_re_read_once_all_are_idle() -> None:
    recovery = DeliveryRecovery()
    failed(recovery, loop=1)
    # Loop 0 holds entries (a batch in flight): posted twice if a re-read took them too.
    assert recovery.next_read(all_idle=False) == "waiting"
    assert recovery.next_read(all_idle=False) == "waiting"
    assert recovery.next_read(all_idle=True) == "now"
    # One re-read is all a failure asks for.
    assert recovery.next_read(all_idle=True) == "no"
    assert recovery.failures == 1


def test_a_re_read_waits_while_a_loop_reads_claims_or_settles() -> None:
    recovery = DeliveryRecovery()
    assert recovery.next_read(all_idle=True) == "no"
    recovery.read_started()  # loop 1 blocks in its read of new entries
    recovery.failed_elsewhere()  # the subscription's connection dropped
    assert recovery.next_read(all_idle=True) == "waiting"
    recovery.read_started()  # loop 0 reads what is there without blocking
    recovery.read_ended()
    assert recovery.next_read(all_idle=True) == "waiting"  # loop 1 still reads
    recovery.read_ended()
    assert recovery.next_read(all_idle=True) == "now"
    assert recovery.failures == 1


def test_a_failure_elsewhere_or_a_restart_makes_a_re_read_due() -> None:
    recovery = DeliveryRecovery()
    recovery.failed_elsewhere()
    assert recovery.next_read(all_idle=True) == "now"
    recovery.restarted(2)
    assert recovery.next_read(all_idle=True) == "now"
    assert recovery.failures == 1  # a restart is no Redis failure


def test_a_re_read_that_filled_its_count_has_a_later_read_look_again() -> None:
    recovery = DeliveryRecovery()
    recovery.restarted(0)
    assert recovery.next_read(all_idle=True) == "now"
    recovery.more_pending()
    assert recovery.next_read(all_idle=False) == "waiting"
    assert recovery.next_read(all_idle=True) == "now"
    assert recovery.next_read(all_idle=True) == "no"


def test_lost_data_recreates_the_groups_without_backing_off() -> None:
    recovery = DeliveryRecovery()
    for _ in range(5):  # however often: the groups are made again at once each time
        answer = recovery.failed(
            0, 100.0, "NOGROUP No such key", 0.5, lost_data=True, closing=False
        )
        assert answer == RecreateGroups(0.05)
    # No outage began: nothing to say when Redis answers.
    assert recovery.answered(0, 101.0) is None
    assert recovery.next_read(all_idle=True) == "now"
    assert recovery.failures == 5


def test_the_backoff_grows_per_loop_and_resets_when_redis_answers() -> None:
    recovery = DeliveryRecovery()
    first = failed(recovery, loop=0, now=100.0)
    assert first == BackOff(
        0.05,
        Report(logging.WARNING, "outpost: Redis unreachable for delivery 0: Connection refused"),
    )
    assert failed(recovery, loop=0, now=100.5) == BackOff(0.1, None)
    assert failed(recovery, loop=0, now=101.0) == BackOff(0.2, None)
    # Each loop has its own outage.
    other = failed(recovery, loop=1, now=101.0)
    assert isinstance(other, BackOff) and other.seconds == 0.05 and other.report is not None
    assert "delivery 1" in other.report.message
    # A minute on: a reminder.
    reminded = failed(recovery, loop=0, now=161.0)
    assert isinstance(reminded, BackOff) and reminded.seconds == 0.4
    assert reminded.report == Report(
        logging.WARNING,
        "outpost: Redis still unreachable for delivery 0 after 61 s: Connection refused",
    )
    assert recovery.answered(0, 162.5) == Report(
        logging.INFO, "outpost: Redis is back for delivery 0 after 62.5 s"
    )
    assert recovery.answered(0, 163.0) is None
    assert failed(recovery, loop=0, now=170.0) == BackOff(
        0.05,
        Report(logging.WARNING, "outpost: Redis unreachable for delivery 0: Connection refused"),
    )
    assert recovery.failures == 6


def test_a_closing_instance_gives_up_and_counts_nothing() -> None:
    recovery = DeliveryRecovery()
    answer = recovery.failed(0, 100.0, "Connection closed", 0.5, lost_data=False, closing=True)
    assert answer == GiveUp()
    lost = recovery.failed(0, 100.0, "NOGROUP", 0.5, lost_data=True, closing=True)
    assert lost == GiveUp()
    assert (
        recovery.read_beside_post_failed(0, 100.0, "Connection closed", 0.5, closing=True) is None
    )
    assert recovery.failures == 0
    assert recovery.next_read(all_idle=True) == "no"
    assert recovery.answered(0, 101.0) is None


def test_a_read_beside_a_post_that_failed_counts_as_its_loops_failure_without_a_wait() -> None:
    recovery = DeliveryRecovery()
    report = recovery.read_beside_post_failed(3, 100.0, "Connection refused", 0.5, closing=False)
    assert report == Report(
        logging.WARNING, "outpost: Redis unreachable for delivery 3: Connection refused"
    )
    # The loop's outage goes on: its next failure backs off further, silently.
    assert failed(recovery, loop=3, now=100.1) == BackOff(0.1, None)
    assert recovery.next_read(all_idle=True) == "now"
    assert recovery.failures == 2


def test_misuse_raises_at_once() -> None:
    recovery = DeliveryRecovery()
    with pytest.raises(UsageError, match="read_started"):
        recovery.read_ended()
    recovery.read_started()
    recovery.read_ended()
    with pytest.raises(UsageError, match="read_started"):
        recovery.read_ended()
    with pytest.raises(UsageError, match="numbered from 0"):
        failed(recovery, loop=-1)
    with pytest.raises(UsageError, match="numbered from 0"):
        recovery.answered(-1, 0.0)
    with pytest.raises(UsageError, match="numbered from 0"):
        recovery.restarted(-1)
    with pytest.raises(UsageError, match="numbered from 0"):
        recovery.read_beside_post_failed(-1, 0.0, "x", 0.5, closing=False)
    with pytest.raises(UsageError, match="numbered from 0"):
        recovery.failed(-1, 0.0, "x", 0.5, lost_data=False, closing=True)  # closing or not
    assert recovery.failures == 0
