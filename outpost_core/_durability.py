"""How far an event has got when ``track()`` returns: an opt-in durability setting.

Redis replicates asynchronously: a primary acknowledges a write before any replica has it, and a
fail-over in between loses the write. ``"primary"`` (the default) returns once the primary ran the
track script. ``"replica"`` also waits, on the same connection, for ``WAIT <replicas> <ms>``: Redis
counts the replicas that acknowledged the connection's writes so far, and a promoted replica holds
every event ``track()`` returned for. The driver sends the command; this module decides what the
setting asks for and what WAIT's answer means.
"""

from __future__ import annotations

import attrs

from .errors import UsageError

PRIMARY = "primary"
REPLICA = "replica"


@attrs.frozen(slots=True)
class Durability:
    replicas: int
    """How many replicas must acknowledge an event before ``track()`` returns (0: none)."""
    timeout_ms: int
    """How long ``WAIT`` waits for them."""

    @classmethod
    def of(cls, name: str, timeout: float) -> Durability:
        """The setting ``durability=name``, ``durability_timeout=timeout`` (seconds)."""
        if name not in (PRIMARY, REPLICA):
            raise UsageError(f"durability must be {PRIMARY!r} or {REPLICA!r}, got {name!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise UsageError(f"durability_timeout must be a positive number, got {timeout!r}")
        # WAIT's 0 means "for ever": a timeout under a millisecond waits one.
        return cls(replicas=1 if name == REPLICA else 0, timeout_ms=max(1, round(timeout * 1000)))

    def wait(self) -> tuple[str, int, int] | None:
        """The command to send after the track script, on its connection; ``None``: none."""
        return ("WAIT", self.replicas, self.timeout_ms) if self.replicas else None

    def shortfall(self, acknowledged: object) -> str | None:
        """Why the event is less durable than asked, from WAIT's answer; ``None`` if it is not."""
        if isinstance(acknowledged, bool) or not isinstance(acknowledged, int):
            return f"WAIT answered {acknowledged!r} instead of a count of replicas"
        if acknowledged >= self.replicas:
            return None
        return (
            f"{acknowledged} of {self.replicas} replica(s) acknowledged the event within "
            f"{self.timeout_ms} ms"
        )
