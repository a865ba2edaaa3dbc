"""Outpost for asyncio applications (FastAPI, Starlette, aiohttp)."""

from __future__ import annotations

from outpost_async._client import AsyncOutpost
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

__all__ = [
    "AsyncOutpost",
    "Balance",
    "InvalidEvent",
    "NotDurable",
    "NotReady",
    "OutpostClosed",
    "OutpostError",
    "RedisUnavailable",
    "UnknownMeter",
    "UnsupportedMeter",
    "UsageError",
]
