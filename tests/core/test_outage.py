"""How a loop that retries Redis reports an outage (``_outage``)."""

from __future__ import annotations

import logging

import pytest

from outpost_core import Outage, Report


def test_redis_answering_reports_nothing() -> None:
    outage = Outage("the subscriber")
    assert outage.succeeded(10.0) is None
    assert (outage.down, outage.failures, outage.error) == (False, 0, None)


def test_the_first_failure_warns_once() -> None:
    outage = Outage("the subscriber")
    delay, report = outage.failed(100.0, "Connection refused", 0.5)
    assert report == Report(
        logging.WARNING, "outpost: Redis unreachable for the subscriber: Connection refused"
    )
    assert delay == pytest.approx(0.05 * 0.75)
    assert (outage.down, outage.failures, outage.error) == (True, 1, "Connection refused")
    # Thousands of failures a second: silent until a minute has passed.
    for i in range(1, 1000):
        _, report = outage.failed(100.0 + i * 0.0599, "Connection refused", 0.5)
        assert report is None


def test_the_delays_back_off_up_to_the_cap() -> None:
    outage = Outage("delivery 0", base=0.1, cap=1.0)
    delays = [outage.failed(0.0, "down", 1.0)[0] for _ in range(7)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


def test_a_reminder_only_after_a_minute_then_a_minute_after_it() -> None:
    outage = Outage("delivery 0")
    outage.failed(100.0, "timeout", 0.5)
    assert outage.failed(159.9, "timeout", 0.5)[1] is None
    _, reminder = outage.failed(160.0, "Connection reset", 0.5)
    assert reminder == Report(
        logging.WARNING,
        "outpost: Redis still unreachable for delivery 0 after 60 s: Connection reset",
    )
    assert outage.error == "Connection reset"
    assert outage.failed(219.9, "x", 0.5)[1] is None  # the next one counts from the reminder
    _, reminder = outage.failed(220.5, "x", 0.5)
    assert reminder is not None and "after 120 s: x" in reminder.message


def test_recovery_reports_how_long_it_lasted_then_a_new_outage_warns_again() -> None:
    outage = Outage("the subscriber", reminder=30.0)
    outage.failed(10.0, "down", 0.5)
    outage.failed(12.0, "down", 0.5)
    assert outage.succeeded(12.3) == Report(
        logging.INFO, "outpost: Redis is back for the subscriber after 2.3 s"
    )
    assert (outage.down, outage.failures, outage.error) == (False, 0, None)
    assert outage.succeeded(13.0) is None  # once
    delay, report = outage.failed(50.0, "down again", 0.0)
    assert report is not None and report.level == logging.WARNING
    assert report.message == "outpost: Redis unreachable for the subscriber: down again"
    assert delay == pytest.approx(0.05 * 0.5)  # the backoff starts over
    assert outage.failed(79.0, "down", 0.5)[1] is None
    assert outage.failed(80.0, "down", 0.5)[1] is not None  # its own reminder period
