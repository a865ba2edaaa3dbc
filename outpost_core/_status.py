"""What an instance reports of its connections (``Outpost.status``), the same for both drivers."""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True)
class Status:
    """A look at an instance's connections."""

    websocket: str
    """The WebSocket to Polar: ``disconnected``, ``connecting``, ``handshaking``, ``open``,
    ``closed``, or ``none`` without an access token."""
    websocket_error: str | None
    """Why it last failed or was refused (an HTTP status with Polar's detail, a connection
    refused, a DNS or TLS error), or ``None``."""
    subscribed: bool
    """Whether the copies follow Redis's change channels (see ``subscribed``)."""
    redis_error: str | None
    """The error of a Redis outage in progress, or ``None`` while Redis answers."""
    delivery_stalled: str | None
    """Why delivery to Polar is stalled, or ``None``."""
    failed_loop: str | None = None
    """A background loop that failed in the last minute and is being restarted (its name and its
    error, without secrets), or ``None``."""
    mode: str = "snapshots"
    """How Polar is followed: ``snapshots`` (the snapshot protocol), ``public`` (Polar's public
    API: polls and webhooks), or ``auto`` while the instance has not found out yet."""
    mode_reason: str = ""
    """Why this mode runs (asked for, or what Polar answered on ``/v1/outpost/``)."""
