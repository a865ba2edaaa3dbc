"""Bucket arithmetic. Times are integers: microseconds since the Unix epoch (UTC)."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

BUCKET_US = 300_000_000
"""A bucket is five minutes, as Polar's ``REDUCER_BUCKET_SIZE``."""

HOUR_US = 3_600_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_US = 253_402_300_799_999_999
"""The last microsecond of year 9999, the latest instant a datetime holds."""


def floor_bucket(t_us: int) -> int:
    """Start of the bucket holding ``t_us``.

    Polar floors whole seconds first; flooring microseconds to a 300 s boundary gives the same
    boundaries, because a boundary is a whole second.
    """
    return t_us - t_us % BUCKET_US


def to_us(moment: datetime) -> int:
    """A timezone-aware datetime as microseconds since the epoch, exactly (no float rounding)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("a naive datetime has no defined instant; pass a timezone-aware one")
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(t_us: int) -> datetime:
    """The UTC datetime of ``t_us``, exactly."""
    return _EPOCH + timedelta(microseconds=t_us)


def iso(t_us: int) -> str:
    """ISO-8601 with microseconds and ``Z``, the form sent to Polar's ingestion API."""
    seconds, micros = divmod(t_us, 1_000_000)
    return f"{_iso_second(seconds)}.{micros:06d}Z"


@functools.lru_cache(maxsize=64)  # track() stamps most events within the same few seconds
def _iso_second(seconds: int) -> str:
    # isoformat pads the year to four digits (strftime("%Y") does not) and is fast C code.
    return from_us(seconds * 1_000_000).replace(tzinfo=None).isoformat(timespec="seconds")
