"""Outpost for threaded applications (Django, Flask, scripts)."""

from __future__ import annotations

from outpost_core import (
    Balance,
    InvalidEvent,
    NotDurable,
    NotReady,
    OutpostClosed,
    OutpostError,
    RedisUnavailable,
    UnknownMeter,
    UnsupportedMeter,
    UsageError,
)
from outpost_sync._client import Outpost

__all__ = [
    "Balance",
    "InvalidEvent",
    "NotDurable",
    "NotReady",
    "Outpost",
    "OutpostClosed",
    "OutpostError",
    "RedisUnavailable",
    "UnknownMeter",
    "UnsupportedMeter",
    "UsageError",
]
