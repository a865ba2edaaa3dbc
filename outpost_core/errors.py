"""Errors raised to the caller of Outpost.

Like h11, Outpost separates what *you* did wrong (raised at once, from the call that did it) from
what a peer did wrong (Redis, Polar, the WebSocket). Peer misbehaviour is never raised by the core:
it becomes a counted, logged :class:`Rejection` and the state machine carries on.
"""

from __future__ import annotations


class OutpostError(Exception):
    """Base class of every error Outpost raises."""


class InvalidEvent(OutpostError, ValueError):
    """``track()`` was given something Polar would refuse; nothing was written."""


class NotReady(OutpostError):
    """A first read got no snapshot from Polar within ``snapshot_timeout``."""


class UnknownMeter(OutpostError, LookupError):
    """The meter is not in Polar's configuration (or the configuration has not arrived yet)."""


class UnsupportedMeter(OutpostError):
    """The meter's aggregation cannot be reduced into buckets (``unique``)."""


class UsageError(OutpostError):
    """The API was misused: wrong arguments, wrong order of calls, or use after ``close()``."""


class OutpostClosed(UsageError):
    """The instance was closed."""


class RedisUnavailable(OutpostError):
    """Redis did not answer; nothing was tracked."""


class NotDurable(RedisUnavailable):
    """``durability="replica"``: the primary wrote the event, but no replica acknowledged it in
    ``durability_timeout``. The event counts and will be delivered, unless the primary fails
    before its replica has it; retrying ``track()`` with the same ``event_id`` is safe (a retry
    writes nothing the primary already holds) and waits for the replica again."""
