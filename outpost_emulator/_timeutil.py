"""Microsecond times and 5-minute buckets, as docs/protocol.md defines them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

SECOND_US = 1_000_000
MINUTE_US = 60 * SECOND_US
HOUR_US = 60 * MINUTE_US
BUCKET_US = 5 * MINUTE_US
# Billing seals a bucket this long after its end, once every event of it has reached Postgres.
SEAL_AFTER_US = 11 * MINUTE_US
# cold_until never looks further back than this.
LOOKBACK_US = HOUR_US

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def floor_bucket(t_us: int) -> int:
    """Start of the 5-minute bucket holding `t_us` (Python's % floors, also before 1970)."""
    return t_us - t_us % BUCKET_US


def to_us(dt: datetime) -> int:
    """Exact integer microseconds of an aware datetime (no float rounding)."""
    if dt.tzinfo is None:
        raise ValueError("datetime must be timezone-aware")
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * SECOND_US + delta.microseconds


def from_us(t_us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=t_us)


def iso(t_us: int) -> str:
    """Polar's JSON datetime form: UTC with a `Z`."""
    return from_us(t_us).isoformat().replace("+00:00", "Z")


def parse_iso(text: str) -> datetime:
    """Parse an ISO-8601 string; raises ValueError. May return a naive datetime."""
    # Python 3.11 accepts a trailing Z, a space separator and most ISO-8601 forms.
    return datetime.fromisoformat(text.strip())
