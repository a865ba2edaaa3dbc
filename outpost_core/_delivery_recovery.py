"""What the delivery loops of one instance do when Redis fails them, and when a loop reads this
consumer's own pending entries again.

A settlement Redis acknowledged and then lost (a fail-over to a replica that never got it, a
restart without its data) leaves its outbox entries pending for this instance's consumer, where
nothing would deliver them before ``claim_idle``. So after any Redis failure the instance meets
(a delivery loop's, or one elsewhere: the change subscription, a state load, a shard that moved
to another node), and after a delivery loop's restart, one read of a loop takes this consumer's
pending entries again (``XREADGROUP ... 0``) instead of new ones. That read waits until no loop
holds entries and none has some in flight (a read, a claim, a settle): they would be posted
twice. While it waits, a loop reads new entries without blocking and rests on the deliveries
signal: a loop blocked in its read would keep the others from the re-read, each in turn.

A delivery loop's own Redis failure is retried: backing off by the loop's :class:`Outage` (which
says when an outage starts, reminds, ends), or, when the error says Redis lost its data
(``lost_its_data``: the groups are gone), creating the groups again at once; never once the
instance is closing (the work stays queued in Redis).

One :class:`DeliveryRecovery` per instance, beside its loops' ``Delivery`` machines; the driver
calls it holding its lock, and does what it answers.
"""

from __future__ import annotations

from typing import Literal

import attrs

from ._outage import Outage, Report
from .errors import UsageError

LOST_DATA_WAIT = 0.05
"""Seconds a loop waits after creating the groups again, before it tries once more."""

Reread = Literal["now", "waiting", "no"]
"""Which read a loop does: ``"now"`` this consumer's pending entries again; ``"waiting"`` new
entries without blocking, then rest (a re-read is due, but a loop holds or moves entries);
``"no"`` new entries, as asked (none is due)."""


@attrs.frozen
class BackOff:
    """Wait ``seconds`` before trying again; log ``report`` first, if any."""

    seconds: float
    report: Report | None


@attrs.frozen
class RecreateGroups:
    """Redis lost its data: create the outbox groups again (a failure there is ignored: the next
    try meets it again), then wait ``seconds``."""

    seconds: float = LOST_DATA_WAIT


@attrs.frozen
class GiveUp:
    """The instance is closing: stop trying; what the call would have done stays queued."""


AfterFailure = BackOff | RecreateGroups | GiveUp


class DeliveryRecovery:
    """One instance's rule for Redis failures of its delivery loops and for re-reads of its
    pending entries. Loops are numbered from 0."""

    def __init__(self) -> None:
        self._outages: dict[int, Outage] = {}
        self._due = False
        self._reading = 0
        self.failures = 0
        """Redis failures this instance met, in any loop (delivery's or another)."""

    def failed(
        self, loop: int, now: float, error: str, draw: float, *, lost_data: bool, closing: bool
    ) -> AfterFailure:
        """A call of delivery loop ``loop`` failed in Redis (``error``, its text; ``lost_data``:
        ``lost_its_data(error)``; ``draw`` in [0, 1), the backoff's jitter). What to do before
        trying again."""
        outage = self._outage(loop)
        if closing:
            return GiveUp()
        self.failures += 1
        self._due = True
        if lost_data:
            return RecreateGroups()
        delay, report = outage.failed(now, error, draw)
        return BackOff(delay, report)

    def read_beside_post_failed(
        self, loop: int, now: float, error: str, draw: float, *, closing: bool
    ) -> Report | None:
        """The read a loop does beside a post, tried once, failed in Redis: it found nothing, and
        what it may have taken is read again later. The failure counts as the loop's (what to
        log); no wait, the post goes on."""
        outage = self._outage(loop)
        if closing:
            return None
        self.failures += 1
        self._due = True
        return outage.failed(now, error, draw)[1]

    def answered(self, loop: int, now: float) -> Report | None:
        """A call of delivery loop ``loop`` succeeded: what to log if that ends its outage."""
        return self._outage(loop).succeeded(now)

    def failed_elsewhere(self) -> None:
        """A Redis failure outside the delivery loops (the subscription, a state load, a shard
        that moved: a fail-over no call saw fail)."""
        self.failures += 1
        self._due = True

    def restarted(self, loop: int) -> None:
        """Delivery loop ``loop`` starts again with a fresh ``Delivery``: what the old one held
        is still pending for this consumer."""
        self._outage(loop)
        self._due = True

    def next_read(self, *, all_idle: bool) -> Reread:
        """A loop is about to read (``all_idle``: every loop's ``Delivery`` of this instance is
        idle, its own included). A ``"now"`` is the one re-read of what was due."""
        if not self._due:
            return "no"
        if self._reading or not all_idle:
            return "waiting"
        self._due = False
        return "now"

    def more_pending(self) -> None:
        """A re-read filled its count: more may be pending, for a later read to take."""
        self._due = True

    def read_started(self) -> None:
        """A loop began a read of entries, or a claim or settle of some (each changes this
        consumer's pending entries as a read does). Told after ``next_read``, in the same hold
        of the driver's lock."""
        self._reading += 1

    def read_ended(self) -> None:
        """One that began ended, whatever came of it."""
        if not self._reading:
            raise UsageError("read_ended() without a read_started() still open")
        self._reading -= 1

    def _outage(self, loop: int) -> Outage:
        if loop < 0:
            raise UsageError(f"delivery loops are numbered from 0, got {loop}")
        outage = self._outages.get(loop)
        if outage is None:
            outage = self._outages[loop] = Outage(f"delivery {loop}")
        return outage
