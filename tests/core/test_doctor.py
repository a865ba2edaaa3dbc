"""The verdicts of `outpost doctor` and `outpost outbox`, without I/O."""

from __future__ import annotations

import email.utils

import pytest

from outpost_core._doctor import (
    ConsumerState,
    OutboxState,
    Status,
    Verdict,
    clock_skew,
    outbox,
    overall,
    redis_version,
)

NOW_US = 1_800_000_000_000_000


def date(seconds: float) -> str:
    return email.utils.formatdate(seconds, usegmt=True)


@pytest.mark.parametrize(
    ("version", "status"),
    [("7.0.15", Status.OK), ("7", Status.OK), ("8.2.1", Status.OK), ("6.2.14", Status.FAIL)],
)
def test_redis_version(version: str, status: Status) -> None:
    assert redis_version(version).status is status


def test_an_unreadable_redis_version_fails() -> None:
    verdict = redis_version("seven")
    assert verdict.status is Status.FAIL and "unreadable" in verdict.detail


def test_clock_within_the_limit() -> None:
    verdict = clock_skew(NOW_US, date(NOW_US / 1e6 - 1))
    assert verdict.status is Status.OK and verdict.detail.startswith("+1.0 s")


def test_a_clock_ahead_of_polar_fails() -> None:
    verdict = clock_skew(NOW_US, date(NOW_US / 1e6 - 30))
    assert verdict.status is Status.FAIL and "30.0 s ahead" in verdict.detail


def test_a_clock_far_behind_polar_warns() -> None:
    verdict = clock_skew(NOW_US, date(NOW_US / 1e6 + 120))
    assert verdict.status is Status.WARN and "120.0 s behind" in verdict.detail


@pytest.mark.parametrize("header", [None, "", "not a date"])
def test_a_missing_or_unreadable_date_warns(header: str | None) -> None:
    assert clock_skew(NOW_US, header).status is Status.WARN


def test_overall_and_line() -> None:
    ok, warn, fail = (Verdict("x", s, "d") for s in (Status.OK, Status.WARN, Status.FAIL))
    assert overall([ok, warn]) == 0 and overall([ok, fail]) == 1
    assert fail.line() == "FAIL  x: d"


def state(*consumers: ConsumerState, depth: int = 0, age: float | None = None) -> OutboxState:
    return OutboxState(depth=[depth] + [0] * 15, oldest_age_s=age, consumers=consumers)


def test_an_empty_outbox_is_ok() -> None:
    verdict = outbox(state())
    assert verdict.status is Status.OK and verdict.detail.startswith("0 entries; 0 consumers")


def test_entries_of_gone_instances_warn_while_one_is_alive_and_fail_without() -> None:
    gone, alive = ConsumerState("a", 5, False), ConsumerState("b", 1, True)
    with_alive = outbox(state(gone, alive, depth=6, age=3.0))
    assert with_alive.status is Status.WARN and "takes them within seconds" in with_alive.detail
    alone = outbox(state(gone, depth=5, age=3.0))
    assert alone.status is Status.FAIL and "outpost outbox release" in alone.detail
    assert state(gone, alive).stranded == 5


def test_old_entries_warn() -> None:
    alive = ConsumerState("b", 0, True)
    behind = outbox(state(alive, depth=3, age=120.0))
    assert behind.status is Status.WARN and "behind or stalled" in behind.detail
    idle = outbox(state(depth=3, age=120.0))
    assert idle.status is Status.WARN and "none alive" in idle.detail
    assert outbox(state(alive, depth=3, age=5.0)).status is Status.OK
