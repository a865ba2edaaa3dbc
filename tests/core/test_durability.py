"""What the durability setting asks Redis for, and what WAIT's answer means (``_durability``)."""

from __future__ import annotations

import pytest

from outpost_core import Durability, UsageError


def test_primary_sends_no_wait_and_replica_waits_for_one_replica() -> None:
    assert Durability.of("primary", 1.0).wait() is None
    assert Durability.of("replica", 0.25).wait() == ("WAIT", 1, 250)
    assert Durability.of("replica", 0.0001).wait() == ("WAIT", 1, 1)  # WAIT's 0 is for ever


def test_a_replica_that_acknowledged_is_enough() -> None:
    replica = Durability.of("replica", 1.0)
    assert replica.shortfall(1) is None
    assert replica.shortfall(2) is None
    assert replica.shortfall(0) == "0 of 1 replica(s) acknowledged the event within 1000 ms"


def test_an_answer_that_is_not_a_count_is_a_shortfall() -> None:
    replica = Durability.of("replica", 1.0)
    assert replica.shortfall(b"OK") == "WAIT answered b'OK' instead of a count of replicas"
    assert replica.shortfall(True) is not None


@pytest.mark.parametrize(
    ("name", "timeout"),
    [("replicas", 1.0), ("", 1.0), ("replica", 0), ("replica", -1.0), ("replica", True),
     ("replica", "1"), ("replica", float("nan"))],
)  # fmt: skip
def test_a_wrong_setting_is_refused_at_once(name: str, timeout: object) -> None:
    with pytest.raises(UsageError):
        Durability.of(name, timeout)  # type: ignore[arg-type]
