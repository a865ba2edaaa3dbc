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


class InvalidWebhook(OutpostError):
    """A webhook delivery whose signature does not hold (or whose timestamp is too far from
    now): answer it 401 and take nothing from it. The message says why, never the secret."""


class UnknownMeter(OutpostError, LookupError):
    """The meter is not in Polar's configuration (or the configuration has not arrived yet)."""


class UnsupportedMeter(OutpostError):
    """The meter's aggregation cannot be reduced into buckets (``unique``)."""


class UsageError(OutpostError):
    """The API was misused: wrong arguments, wrong order of calls, or use after ``close()``."""


class ConfigurationError(UsageError, ValueError):
    """An option the instance was given (or read from the environment) cannot work: a Redis URL
    of an unknown scheme, a certificate bundle that cannot be loaded, a value out of range."""


class OutpostClosed(UsageError):
    """The instance was closed."""


class RedisUnavailable(OutpostError):
    """Redis did not answer; nothing was tracked."""


class NotDurable(RedisUnavailable):
    """``durability="replica"``: the primary wrote the event, but no replica acknowledged it in
    ``durability_timeout`` (a replica that lags, on a busy machine, misses it too). The event
    counts and will be delivered, unless the primary fails before its replica has it; retrying
    ``track()`` with the same ``event_id`` is safe (a retry writes nothing the primary already
    holds) and waits for the replica again. :attr:`event_id` is that id, also when ``track()``
    made it up."""

    def __init__(self, message: str, event_id: str | None = None) -> None:
        super().__init__(message)
        self.event_id = event_id
        """The event written on the primary only; ``None`` for a reservation's hold or release
        (``reserve()`` again, or ``release()``)."""


class InsufficientBalance(OutpostError):
    """The customer's available balance (``balance - held``, over every instance and every name
    of the customer) did not cover what was asked: nothing was held, nothing was recorded."""

    def __init__(self, meter_id: str, units: float, balance: float, held: float) -> None:
        super().__init__(
            f"meter {meter_id!r}: {units:g} units asked, {balance - held:g} available "
            f"(balance {balance:g}, {held:g} held by open reservations)"
        )
        self.meter_id = meter_id
        self.units = units
        """What was asked (a reservation's units; a conditional track's value, 1 for a count)."""
        self.balance = balance
        """``credited - consumed`` as the admission saw it, in Redis."""
        self.held = held
        """Units held by open reservations as the admission saw them."""

    @property
    def available(self) -> float:
        return self.balance - self.held


class CannotAdmit(OutpostError):
    """Admission cannot be decided exactly in one script, so it is refused rather than decided on
    a partial view: on Redis Cluster, a customer whose names (Polar's aliases) live in different
    slots."""
