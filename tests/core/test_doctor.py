"""The verdicts of `outpost doctor` and `outpost outbox`, without I/O."""

from __future__ import annotations

import email.utils

import pytest

from outpost_core.doctor import (
    ConsumerState,
    OutboxState,
    Severity,
    Verdict,
    clock_skew,
    outbox,
    overall,
    redis_version,
    shard_spread,
)

NOW_US = 1_800_000_000_000_000


def date(seconds: float) -> str:
    return email.utils.formatdate(seconds, usegmt=True)


@pytest.mark.parametrize(
    ("version", "status"),
    [
        ("7.0.15", Severity.OK),
        ("7", Severity.OK),
        ("8.2.1", Severity.OK),
        ("6.2.14", Severity.FAIL),
    ],
)
def test_redis_version(version: str, status: Severity) -> None:
    assert redis_version(version).status is status


def test_an_unreadable_redis_version_fails() -> None:
    verdict = redis_version("seven")
    assert verdict.status is Severity.FAIL and "unreadable" in verdict.detail


def test_clock_within_the_limit() -> None:
    verdict = clock_skew(NOW_US, date(NOW_US / 1e6 - 1))
    assert verdict.status is Severity.OK and verdict.detail.startswith("+1.0 s")


def test_a_clock_ahead_of_polar_fails() -> None:
    verdict = clock_skew(NOW_US, date(NOW_US / 1e6 - 30))
    assert verdict.status is Severity.FAIL and "30.0 s ahead" in verdict.detail


def test_a_clock_far_behind_polar_warns() -> None:
    verdict = clock_skew(NOW_US, date(NOW_US / 1e6 + 120))
    assert verdict.status is Severity.WARN and "120.0 s behind" in verdict.detail


@pytest.mark.parametrize("header", [None, "", "not a date"])
def test_a_missing_or_unreadable_date_warns(header: str | None) -> None:
    assert clock_skew(NOW_US, header).status is Severity.WARN


def test_overall_and_line() -> None:
    ok, warn, fail = (Verdict("x", s, "d") for s in (Severity.OK, Severity.WARN, Severity.FAIL))
    assert overall([ok, warn]) == 0 and overall([ok, fail]) == 1
    assert fail.line() == "FAIL  x: d"


def state(*consumers: ConsumerState, depth: int = 0, age: float | None = None) -> OutboxState:
    return OutboxState(depth=[depth] + [0] * 15, oldest_age_s=age, consumers=consumers)


def test_an_empty_outbox_is_ok() -> None:
    verdict = outbox(state())
    assert verdict.status is Severity.OK and verdict.detail.startswith("0 entries; 0 consumers")


def test_entries_of_gone_instances_warn_while_one_is_alive_and_fail_without() -> None:
    gone, alive = ConsumerState("a", 5, False), ConsumerState("b", 1, True)
    with_alive = outbox(state(gone, alive, depth=6, age=3.0))
    assert with_alive.status is Severity.WARN and "takes them within seconds" in with_alive.detail
    alone = outbox(state(gone, depth=5, age=3.0))
    assert alone.status is Severity.FAIL and "outpost outbox release" in alone.detail
    assert state(gone, alive).stranded == 5


def test_released_entries_wait_for_an_instance_without_asking_for_a_release_again() -> None:
    released = ConsumerState("outpost-released", 5, False, released=True)
    assert state(released).stranded == 0 and state(released).released == 5
    waiting = outbox(state(released, depth=5, age=3.0))
    assert waiting.status is Severity.WARN and "outpost outbox release" not in waiting.detail
    assert "5 entries released, for the next instance to start" in waiting.detail
    assert "(0 alive, 0 gone)" in waiting.detail
    taken = outbox(state(released, ConsumerState("b", 0, True), depth=5, age=3.0))
    assert taken.status is Severity.OK


def test_old_entries_warn() -> None:
    alive = ConsumerState("b", 0, True)
    behind = outbox(state(alive, depth=3, age=120.0))
    assert behind.status is Severity.WARN and "behind or stalled" in behind.detail
    idle = outbox(state(depth=3, age=120.0))
    assert idle.status is Severity.WARN and "none alive" in idle.detail
    assert outbox(state(alive, depth=3, age=5.0)).status is Severity.OK


@pytest.mark.parametrize(
    ("policy", "maxmemory", "status", "words"),
    [
        ("noeviction", 1 << 30, Severity.OK, "never drops"),
        ("allkeys-lru", 0, Severity.OK, "no maxmemory limit"),
        ("volatile-lru", 1 << 30, Severity.WARN, "state hashes"),
        ("volatile-ttl", 1 << 30, Severity.WARN, "needs noeviction"),
        ("allkeys-lru", 1 << 30, Severity.FAIL, "undelivered events would be lost"),
        ("allkeys-random", 1 << 30, Severity.FAIL, "outbox"),
        ("new-policy", 1 << 30, Severity.WARN, "unknown"),
    ],
)
def test_eviction_policy(policy: str, maxmemory: int, status: Severity, words: str) -> None:
    from outpost_core.doctor import eviction_policy

    verdict = eviction_policy(policy, maxmemory)
    assert verdict.status is status and words in verdict.detail


def test_the_shard_count_stored_or_not() -> None:
    assert shard_spread(64, True, None, None) == Verdict(
        "shards", Severity.OK, "64 shards (stored)"
    )
    verdict = shard_spread(16, False, None, None)
    assert verdict.status is Severity.OK and "none stored yet" in verdict.detail


def test_a_cluster_with_primaries_left_without_a_shard_warns() -> None:
    assert shard_spread(64, True, 4, 4).status is Severity.OK
    idle = shard_spread(2, True, 2, 4)
    assert idle.status is Severity.WARN
    assert idle.detail.startswith("2 shards (stored), over 2 of 4 primaries: the others hold none")
