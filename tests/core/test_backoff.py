"""The one backoff of every retry (``_backoff``)."""

from __future__ import annotations

import pytest

from outpost_core import UsageError
from outpost_core._backoff import backoff


def test_the_ceiling_doubles_per_attempt_up_to_the_cap() -> None:
    ceilings = [backoff(attempt, 0.25, 5.0, 1.0) for attempt in range(1, 8)]
    assert ceilings == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


@pytest.mark.parametrize(("draw", "share"), [(0.0, 0.5), (0.5, 0.75), (0.999, 0.9995)])
def test_the_delay_is_drawn_from_the_upper_half_of_the_ceiling(draw: float, share: float) -> None:
    assert backoff(3, 1.0, 60.0, draw) == pytest.approx(4.0 * share)


@pytest.mark.parametrize("attempt", [1000, 1025, 100_000])
def test_a_huge_attempt_number_stays_at_the_cap(attempt: int) -> None:
    # 2.0 ** 1024 overflows a float: a subscriber failing fast for long enough crashed here.
    assert backoff(attempt, 0.25, 30.0, 0.0) == 15.0


@pytest.mark.parametrize("attempt", [0, -1])
def test_attempts_count_from_one(attempt: int) -> None:
    with pytest.raises(UsageError, match="count from 1"):
        backoff(attempt, 1.0, 2.0, 0.5)
