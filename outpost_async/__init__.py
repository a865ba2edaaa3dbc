"""Outpost for asyncio applications (FastAPI, Starlette, aiohttp)."""

from __future__ import annotations

from outpost_async._client import AsyncOutpost
from outpost_async._reservation import AsyncReservation
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

__all__ = [
    "AsyncOutpost",
    "AsyncReservation",
    "Balance",
    "CannotAdmit",
    "ConfigurationError",
    "InsufficientBalance",
    "InvalidEvent",
    "InvalidWebhook",
    "NotDurable",
    "NotReady",
    "OutpostClosed",
    "OutpostError",
    "RedisUnavailable",
    "UnknownMeter",
    "UnsupportedMeter",
    "UsageError",
]
