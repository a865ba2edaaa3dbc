"""Bucket arithmetic and exact microsecond conversions (``outpost_core._time``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone, tzinfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outpost_core import BUCKET_US, floor_bucket, from_us, to_us
from outpost_core._time import HOUR_US, iso

# 2026-12-02T15:00:00Z, a bucket boundary.
BOUNDARY = 1_796_223_600_000_000


def test_bucket_is_five_minutes_and_an_hour_is_twelve_buckets() -> None:
    assert BUCKET_US == 5 * 60 * 1_000_000
    assert HOUR_US == 12 * BUCKET_US
    assert BOUNDARY % BUCKET_US == 0


@pytest.mark.parametrize(
    ("t_us", "start"),
    [
        (BOUNDARY, BOUNDARY),
        (BOUNDARY + 1, BOUNDARY),
        (BOUNDARY - 1, BOUNDARY - BUCKET_US),
        (BOUNDARY + BUCKET_US - 1, BOUNDARY),
        (BOUNDARY + BUCKET_US, BOUNDARY + BUCKET_US),
        (0, 0),
        (1, 0),
        (-1, -BUCKET_US),
        (-BUCKET_US, -BUCKET_US),
        (-BUCKET_US - 1, -2 * BUCKET_US),
    ],
)
def test_floor_bucket_at_and_around_boundaries(t_us: int, start: int) -> None:
    assert floor_bucket(t_us) == start


@given(st.integers(min_value=-(2**62), max_value=2**62))
def test_floor_bucket_is_the_boundary_at_or_before(t_us: int) -> None:
    start = floor_bucket(t_us)
    assert start % BUCKET_US == 0
    assert start <= t_us < start + BUCKET_US
    assert floor_bucket(start) == start


def test_floor_bucket_matches_polars_whole_second_flooring() -> None:
    # Polar floors whole seconds first: 12:09:59.999999 -> 12:05.
    moment = datetime(2026, 12, 2, 12, 9, 59, 999_999, tzinfo=UTC)
    expected = datetime(2026, 12, 2, 12, 5, tzinfo=UTC)
    assert from_us(floor_bucket(to_us(moment))) == expected
    seconds = int(moment.timestamp())
    assert floor_bucket(to_us(moment)) == (seconds - seconds % 300) * 1_000_000


def test_to_us_is_exact_to_the_microsecond() -> None:
    assert to_us(datetime(1970, 1, 1, tzinfo=UTC)) == 0
    assert to_us(datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC)) == 1
    # A float timestamp() would round this one; the integer arithmetic does not.
    moment = datetime(2262, 4, 11, 23, 47, 16, 854_775, tzinfo=UTC)
    assert to_us(moment) == 9_223_372_036_854_775
    assert to_us(datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)) == -1


def test_to_us_honours_negative_and_positive_offsets() -> None:
    new_york = timezone(timedelta(hours=-5))
    kolkata = timezone(timedelta(hours=5, minutes=30))
    utc = datetime(2026, 12, 2, 15, 0, tzinfo=UTC)
    assert to_us(datetime(2026, 12, 2, 10, 0, tzinfo=new_york)) == to_us(utc)
    assert to_us(datetime(2026, 12, 2, 20, 30, tzinfo=kolkata)) == to_us(utc)
    assert to_us(utc) == BOUNDARY


def test_to_us_refuses_a_naive_datetime() -> None:
    with pytest.raises(ValueError, match="naive"):
        to_us(datetime(2026, 12, 2, 15, 0))


def test_to_us_refuses_a_tzinfo_without_an_offset() -> None:
    class NoOffset(tzinfo):
        def utcoffset(self, dt: datetime | None) -> timedelta | None:
            return None

        def dst(self, dt: datetime | None) -> timedelta | None:
            return None

        def tzname(self, dt: datetime | None) -> str | None:
            return None

    with pytest.raises(ValueError, match="naive"):
        to_us(datetime(2026, 12, 2, 15, 0, tzinfo=NoOffset()))


@given(
    st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=-11)), timezone(timedelta(hours=13, minutes=45))]
        ),
    )
)
def test_to_us_and_from_us_round_trip(moment: datetime) -> None:
    t_us = to_us(moment)
    back = from_us(t_us)
    assert back == moment
    assert back.tzinfo is UTC
    assert to_us(back) == t_us


@given(st.integers(min_value=-(10**16), max_value=10**17))
def test_from_us_then_to_us_is_the_identity(t_us: int) -> None:
    assert to_us(from_us(t_us)) == t_us


def test_iso_has_microseconds_and_z() -> None:
    assert iso(0) == "1970-01-01T00:00:00.000000Z"
    assert iso(BOUNDARY + 123_456) == "2026-12-02T15:00:00.123456Z"
    assert iso(-1) == "1969-12-31T23:59:59.999999Z"
    assert datetime.fromisoformat(iso(BOUNDARY + 7)) == from_us(BOUNDARY + 7)


def test_iso_pads_years_before_1000() -> None:
    assert iso(to_us(datetime(5, 1, 1, tzinfo=UTC))) == "0005-01-01T00:00:00.000000Z"
