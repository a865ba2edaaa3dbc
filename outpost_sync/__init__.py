"""Outpost for threaded applications (Django, Flask, scripts)."""

from __future__ import annotations

from outpost_core import (
    Balance,
    CannotAdmit,
    ConfigurationError,
    InsufficientBalance,
    InvalidEvent,
    InvalidWebhook,
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
from outpost_sync._reservation import Reservation

__all__ = [
    "Balance",
    "CannotAdmit",
    "ConfigurationError",
    "InsufficientBalance",
    "InvalidEvent",
    "InvalidWebhook",
    "NotDurable",
    "NotReady",
    "Outpost",
    "OutpostClosed",
    "OutpostError",
    "RedisUnavailable",
    "Reservation",
    "UnknownMeter",
    "UnsupportedMeter",
    "UsageError",
]
