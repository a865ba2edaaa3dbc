"""One customer meter in the public-API mode: Polar's figure (the anchor) plus Outpost's own
events that the figure does not provably include yet (the ledger).

Polar's public API reports a customer meter (consumed, credited, balance, ``modified_at``) but
never which events it counts. A recompute reads usage in one statement and then stamps
``modified_at``, so an event committed before ``modified_at`` minus a margin is included, if
that reading is a recompute at all (activation moves ``modified_at`` without one). An event
Outpost sent is committed before Polar's 2xx. So an event of the ledger is dropped (pruned) only
when both hold:

- it was acknowledged (2xx, on Outpost's clock) before ``modified_at - margin``; and
- Polar's consumed rose, since the last reading accepted, by at least the total of the events
  about to be dropped (for ``max``: the reading is at least their largest value; for
  ``unique``: consumed did not fall).

Otherwise nothing is dropped: an event counted twice is safe, an event never counted is not.
"Rose by at least" is measured from a baseline: what Polar's consumed holds beyond the events
still in the ledger, 0 when a window starts and raised by each drop. When every usage goes
through Outpost and the margin holds, the check passes exactly when every event it would drop
is in Polar's figure; a reading that is not a recompute (activation) or a margin too small
makes it fail, and then nothing is dropped. For ``max`` the reading must reach the largest
value to drop; ``unique`` (where a value seen before adds nothing) relies on the margin alone.

A drop in consumed is a reset (a billing cycle): what was acknowledged before the last reading
that still showed the old window (or before the reset instant, when the caller knows it), less
the margin, is dropped at once, since Polar no longer counts it. The rest is checked against
the new window from a baseline of 0; what fails that check cannot be told apart from the old
window, so it stays counted until the next reset and out of later checks ("carried"). Credits
always come from the newest reading.

A reading may also count events the ledger still holds (a recompute within the margin of their
acknowledgement: a credit grant's, say), which the rule above keeps counted twice. For ``count``
and ``sum`` the last basis (the consumed the balance started from) plus what each reading of the
window dropped since is also an upper bound of what the ledger does not hold, so the basis is the
lower of the two (the "cap"), and never below the reading's consumed less the acknowledged
events, so the balance stays at or below the one Polar reported. Only when all usage goes
through Outpost is the cap exact; usage from elsewhere shows once the ledger has drained.

The local balance is the newest reading's balance less every event of the ledger (acknowledged
or still in flight; a negative value counts as 0), so it is never above the balance Polar last
reported. ``avg`` and ``min`` meters cannot be bounded this way: their reading is relayed as it
is and marked approximate.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from ._public_readings import PolarReading
from .errors import UsageError

DEFAULT_MARGIN_US = 60_000_000
"""60 s: covers the gap between Polar's usage statement and its ``modified_at``, plus the skew
between Outpost's clock and Polar's."""

BOUNDED = frozenset({"count", "sum", "max", "unique"})
RELAYED = frozenset({"avg", "min"})


class Outcome(enum.Enum):
    FIRST = "first"  # the first reading: anchors; drops what the check allows
    ACCEPTED = "accepted"  # newer reading; the check passed, the covered events dropped
    REJECTED = "rejected"  # newer reading anchors; the check failed, nothing dropped
    RESET = "reset"  # consumed fell: a new window
    STALE = "stale"  # not newer than the anchor (late, reordered or repeated): ignored
    NO_WATERMARK = "no_watermark"  # modified_at null: anchors only when nothing else did
    PROBED = "probed"  # a quantities answer re-anchored consumed; the check passed
    PROBE_REJECTED = "probe_rejected"  # it re-anchored consumed; the check failed, none dropped
    PROBE_UNUSED = "probe_unused"  # a quantities answer that cannot be used (see observe_probe)


@attrs.frozen(slots=True)
class Entry:
    value: float
    key: str | None  # unique meters: the distinct value
    acked_at_us: int | None = None  # Polar's first 2xx for it, on Outpost's clock


@attrs.frozen(slots=True)
class LocalBalance:
    balance: float | None
    """None until Polar reported this customer meter."""
    approximate: bool
    """True for avg and min meters: Polar's figure relayed, no bound."""
    polar_balance: float | None
    pending: float
    """What the ledger subtracts (its total; for max, what it adds above Polar's consumed)."""
    anchored_at_us: int | None


@attrs.frozen(slots=True)
class Probe:
    """A quantities answer: Polar's consumed over the window, computed when it was asked."""

    consumed: float
    sent_at_us: int
    lag_us: int  # the replica may miss what was committed this long before the request

    @property
    def watermark_us(self) -> int:
        """Events acknowledged before this instant (Outpost's clock) are in the answer."""
        return self.sent_at_us - self.lag_us


@attrs.define
class MeterLedger:
    aggregation: str
    margin_us: int = DEFAULT_MARGIN_US
    anchor: PolarReading | None = None
    baseline: float = 0.0
    """Of Polar's consumed in this window, a lower bound of what no event still in the ledger
    (outside ``carried``) makes up: 0 when a window starts, raised by each accepted drop."""
    entries: dict[str, Entry] = attrs.Factory(dict)
    reset_hint_us: int | None = None
    rejections: int = 0
    probe: Probe | None = None
    carried: set[str] = attrs.Factory(set)
    cap: float | None = None
    """count and sum: the last basis plus what was dropped since, when that basis came from a
    reading with a watermark in this window (None otherwise); see :meth:`_carry_cap`."""

    def __attrs_post_init__(self) -> None:
        if self.aggregation not in BOUNDED | RELAYED:
            raise UsageError(f"unknown aggregation {self.aggregation!r}")
        if self.margin_us < 0:
            raise UsageError("the margin must be >= 0")

    # Outpost's own events ----------------------------------------------------------------

    def record(self, event_id: str, value: float = 1.0, key: str | None = None) -> None:
        """An event of this customer meter was tracked (it counts from now on). Recording the
        same id again changes nothing."""
        if self.aggregation == "unique" and key is None:
            raise UsageError("a unique meter's event needs its distinct value as key")
        if self.aggregation in RELAYED:
            return  # nothing local is subtracted: Polar's figure is relayed
        self.entries.setdefault(event_id, Entry(max(0.0, value), key))

    def acknowledged(self, event_ids: Iterable[str], at_us: int) -> None:
        """Polar answered 2xx to a request carrying these events; the first answer counts."""
        for event_id in event_ids:
            entry = self.entries.get(event_id)
            if entry is not None and entry.acked_at_us is None:
                self.entries[event_id] = attrs.evolve(entry, acked_at_us=at_us)

    def discard(self, event_ids: Iterable[str]) -> None:
        """Events Polar refused for good (they will never count)."""
        for event_id in event_ids:
            self.entries.pop(event_id, None)
            self.carried.discard(event_id)

    def reset_seen(self, at_us: int) -> None:
        """The caller learnt when the current window began (a cycle's webhook, the events list):
        a reset then drops every event acknowledged before it, less the margin."""
        self.reset_hint_us = at_us

    # Polar's readings --------------------------------------------------------------------

    def observe(self, reading: PolarReading) -> Outcome:
        """A reading of Polar's (its ``reset_at_us``, when it has one, is a reset instant
        learnt: :meth:`reset_seen`)."""
        anchor = self.anchor
        if reading.modified_at_us is None:
            if anchor is not None:
                return Outcome.STALE
            self._learn_reset(reading)
            self.anchor = reading
            return Outcome.NO_WATERMARK
        if anchor is not None and (
            anchor.modified_at_us is not None and reading.modified_at_us <= anchor.modified_at_us
        ):
            return Outcome.STALE
        before = self._capping()
        self.cap = None
        self._learn_reset(reading)
        self.anchor = reading
        watermark = reading.modified_at_us - self.margin_us
        if self.probe is not None and watermark >= self.probe.watermark_us:
            # The reading includes all the probe did (what the probe dropped among it).
            self.probe = None
        if anchor is not None and self._is_reset(anchor, reading):
            self._new_window(anchor, reading.modified_at_us)
            if not self._check(reading.consumed, watermark):
                # What the reading should include but the check cannot tell apart from the old
                # window stays counted until the next reset, outside later checks.
                self.carried.update(self._covered(watermark))
            # The drop may hold old-window events Polar does not count: the baseline stays 0.
            self.baseline = 0.0
            return Outcome.RESET
        accepted = self._check(reading.consumed, watermark)
        self._carry_cap(before)
        if accepted:
            return Outcome.FIRST if anchor is None else Outcome.ACCEPTED
        self.rejections += 1
        return Outcome.REJECTED

    def _capping(self) -> tuple[float, float] | None:
        """(the basis, the ledger's total) before a reading or a probe, when the basis bounds
        what the ledger does not hold: a count or sum meter anchored by a reading with a
        watermark."""
        anchor = self.anchor
        if (
            self.aggregation not in ("count", "sum")
            or anchor is None
            or anchor.modified_at_us is None
        ):
            return None
        return self.consumed_basis(), self._total()

    def _carry_cap(self, before: tuple[float, float] | None) -> None:
        """The cap after a reading or a probe: the basis before it plus what it dropped, but
        never below the anchor's consumed less the acknowledged events (those leave the ledger
        only with a reading), so the balance stays at or below the one Polar reported. It is
        fixed here, as the state hash holds it, not moved by later acknowledgements."""
        anchor = self.anchor
        if before is not None and anchor is not None:
            basis, total = before
            acked = sum(e.value for e in self.entries.values() if e.acked_at_us is not None)
            self.cap = max(basis + (total - self._total()), anchor.consumed - acked)

    def _total(self) -> float:
        return sum(e.value for e in self.entries.values())

    def _learn_reset(self, reading: PolarReading) -> None:
        at = reading.reset_at_us
        if at is not None and (self.reset_hint_us is None or at > self.reset_hint_us):
            self.reset_hint_us = at

    def _is_reset(self, anchor: PolarReading, reading: PolarReading) -> bool:
        """Consumed fell, or the reset instant the caller knows lies after the anchor."""
        if reading.consumed < anchor.consumed:
            return True
        hint = self.reset_hint_us
        return (
            hint is not None
            and anchor.modified_at_us is not None
            and reading.modified_at_us is not None
            and anchor.modified_at_us < hint <= reading.modified_at_us
        )

    def _new_window(self, last_old: PolarReading, first_new_us: int) -> None:
        """Drop what was acknowledged before the reset: before the last reading that still
        showed the old window (or the reset instant, when known and not after the reading that
        shows the new window), less the margin."""
        floors = [last_old.modified_at_us] if last_old.modified_at_us is not None else []
        if self.reset_hint_us is not None:
            floors.append(min(self.reset_hint_us, first_new_us))
        self.baseline = 0.0
        # (A probe the reading does not cover stays: what it dropped may be of the new window.)
        floor = max(floors, default=None)
        if floor is not None:
            for event_id in self._acked_before(floor - self.margin_us):
                del self.entries[event_id]
        self.carried &= self.entries.keys()

    def _acked_before(self, watermark: int) -> list[str]:
        return [
            event_id
            for event_id, entry in self.entries.items()
            if entry.acked_at_us is not None and entry.acked_at_us < watermark
        ]

    def _covered(self, watermark: int) -> list[str]:
        """The events a reading with this watermark should include (carried ones aside)."""
        return [e for e in self._acked_before(watermark) if e not in self.carried]

    def _check(self, consumed: float, watermark: int) -> bool:
        covered = self._covered(watermark)
        values = [self.entries[event_id] for event_id in covered]
        total = sum(e.value for e in values)
        if self.aggregation in ("count", "sum"):
            ok = consumed - self.baseline >= total
        elif self.aggregation == "max":
            ok = consumed >= max((e.value for e in values), default=0.0)
        else:  # unique: a value seen before adds nothing, so no sum can be checked
            ok = True
        if ok:
            self.baseline += total
            for event_id in covered:
                del self.entries[event_id]
        return ok

    def observe_probe(self, consumed: float, sent_at_us: int, lag_us: int) -> Outcome:
        """A quantities answer for the current window (count and sum meters): Polar's consumed
        as of ``sent_at_us`` (Outpost's clock), missing at most what was committed within
        ``lag_us`` before (the replica's lag). It re-anchors consumed only (credits come from
        the newest reading): the events acknowledged before ``sent_at_us - lag_us`` leave the
        ledger when consumed rose, beyond the baseline, by at least their total (the readings'
        check). It stays the consumed the balance starts from until a reading covers it.

        Unused (``PROBE_UNUSED``, nothing changes): no anchor yet, another aggregation, not
        newer than the anchor or the last probe, below the consumed the balance starts from
        (a probe never lowers it: it cannot tell a reset from a window misjudged), or above it
        plus every event the ledger holds (Polar cannot have counted more of Outpost's usage:
        the window reached into an earlier one)."""
        anchor = self.anchor
        probe = Probe(consumed, sent_at_us, lag_us)
        basis = self.figure_basis()
        if (
            anchor is None
            or self.aggregation not in ("count", "sum")
            or (
                anchor.modified_at_us is not None
                and probe.watermark_us <= anchor.modified_at_us - self.margin_us
            )
            or (self.probe is not None and sent_at_us <= self.probe.sent_at_us)
            or consumed < basis
            or consumed > basis + self._total()
        ):
            return Outcome.PROBE_UNUSED
        before = self._capping()
        self.probe = probe
        checked = self._check(consumed, probe.watermark_us)
        self._carry_cap(before)
        if checked:
            return Outcome.PROBED
        self.rejections += 1
        return Outcome.PROBE_REJECTED

    def figure_basis(self) -> float:
        """Polar's consumed the balance starts from: the anchor's, or a newer probe's when
        higher (a reading that does not cover the probe cannot lower it: it may miss what the
        probe let go)."""
        anchor = self.anchor
        consumed = 0.0 if anchor is None else anchor.consumed
        return consumed if self.probe is None else max(consumed, self.probe.consumed)

    def consumed_basis(self) -> float:
        """The consumed the balance starts from: Polar's, lowered to the cap when one holds."""
        basis = self.figure_basis()
        return basis if self.cap is None else min(basis, self.cap)

    # The local balance -------------------------------------------------------------------

    def balance(self) -> LocalBalance:
        anchor = self.anchor
        if anchor is None:
            return LocalBalance(None, self.aggregation in RELAYED, None, 0.0, None)
        entries = list(self.entries.values())
        basis = self.consumed_basis()
        if self.aggregation in RELAYED:
            pending = 0.0
        elif self.aggregation == "max":
            pending = max(0.0, max((e.value for e in entries), default=0.0) - basis)
        elif self.aggregation == "unique":
            pending = float(len({e.key for e in entries}))
        else:
            pending = sum(e.value for e in entries)
        # (A probe's consumed above the anchor's is subtracted too: it counts as pending.)
        pending += basis - anchor.consumed
        return LocalBalance(
            anchor.balance - pending,
            self.aggregation in RELAYED,
            anchor.balance,
            pending,
            anchor.modified_at_us,
        )
