"""Telemetry policy, recorded as data: what each record carries, and when it is reported.

The drivers feed a :class:`Recorder` from their hot paths and drain it about once a second, off
them; an adapter (``outpost_io/telemetry.py``) turns what it drains into OpenTelemetry
instruments and spans. Nothing here knows OpenTelemetry, so the policy is tested without it.

Theory of operation:

- **Warm reads** are the hottest path there is (a dict lookup), so they are counted, not timed:
  the session counts them beside each cached balance (:meth:`Session.warm_reads`), and
  :meth:`Recorder.drain` turns the counts since the last drain into one counter record per read.
- **Other reads and writes** carry their duration and outcome, buffered (bounded: beyond
  ``cap`` records a drain they are counted as overflow, not kept) until the drain turns them into
  histogram records. Buckets written are summed per customer and meters.
- **Spans**: a snapshot applied is one finished span; the link's open and close observations
  drive a small state machine (``connection`` while open; ``reconnection`` from a close to the
  next open), reported as :class:`SpanStarted` and :class:`SpanEnded`.
- **Syncs**: the snapshots received and applied since the last report, at most once per export
  interval, and only when they changed.
- **Series**: each drain's records are admitted into the current export interval, at most
  ``series_cap`` distinct series (attribute sets) per instrument; a record of a series beyond it
  is counted as left out (``Drained.left_out``), not reported. The drain that ends an interval
  says so (``Drained.export``): the adapter exports then, so a customer's series lives for the
  interval it was active in and every customer active in it (below the cap) is in its export.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from . import semconv
from ._observations import LinkChanged, Observation, SnapshotApplied
from .errors import (
    CannotAdmit,
    InsufficientBalance,
    InvalidEvent,
    NotReady,
    RedisUnavailable,
    UnknownMeter,
    UnsupportedMeter,
)

ReadKey = tuple[str, str | None, str | None]
"""(meter id, external customer id, customer id) of a read."""
Attributes = Mapping[str, Any]

CAP = 20_000
"""Timed records kept between two drains; beyond it they are counted as overflow."""
FLUSH_EVERY = 1.0
"""Seconds between two drains of the buffers."""
SERIES_CAP = 1_000
"""Distinct series (attribute sets) per instrument in one export interval; records of further
series are counted as left out."""

CONNECTION = "connection"
RECONNECTION = "reconnection"


def customer_attribute(external_customer_id: object, customer_id: object) -> str:
    """The customer as a record names it: ``external:<id>`` or ``customer:<uuid>``."""
    if isinstance(external_customer_id, str):
        return f"external:{external_customer_id}"
    return f"customer:{customer_id if isinstance(customer_id, str) else ''}"


_TRACK_OUTCOMES: tuple[tuple[type[BaseException], str], ...] = (
    (InvalidEvent, semconv.INVALID),
    (NotReady, semconv.NOT_READY),
    (RedisUnavailable, semconv.REDIS_ERROR),
)
_READ_OUTCOMES: tuple[tuple[type[BaseException], str], ...] = (
    (UnknownMeter, semconv.UNKNOWN_METER),
    (UnsupportedMeter, semconv.UNSUPPORTED_METER),
    (BaseException, semconv.NOT_READY),  # whatever else kept the read from an answer
)


_ADMISSION_OUTCOMES: tuple[tuple[type[BaseException], str], ...] = (
    (InsufficientBalance, semconv.INSUFFICIENT_BALANCE),
    (CannotAdmit, semconv.CANNOT_ADMIT),
    (UnknownMeter, semconv.UNKNOWN_METER),
    (UnsupportedMeter, semconv.UNSUPPORTED_METER),
    *_TRACK_OUTCOMES,
)


def admission_outcome(error: BaseException | None) -> str | None:
    """The outcome an admission ending with ``error`` records (``None``: not recorded)."""
    return _outcome(error, _ADMISSION_OUTCOMES, semconv.OK)


def track_outcome(error: BaseException | None) -> str | None:
    """The outcome a ``track()`` ending with ``error`` records (``None``: not recorded)."""
    return _outcome(error, _TRACK_OUTCOMES, semconv.OK)


def read_outcome(error: BaseException | None) -> str:
    """The outcome a read that went past memory records, ending with ``error``."""
    return _outcome(error, _READ_OUTCOMES, semconv.COLD) or semconv.NOT_READY


def _outcome(
    error: BaseException | None, table: tuple[tuple[type[BaseException], str], ...], ok: str
) -> str | None:
    if error is None:
        return ok
    for kind, outcome in table:
        if isinstance(error, kind):
            return outcome
    return None  # a cancellation or a bug: nothing Outpost's names describe


@attrs.frozen(slots=True)
class Record:
    """One histogram record (seconds) or counter increase, with its attributes."""

    value: float
    attributes: Attributes


@attrs.frozen(slots=True)
class SpanStarted:
    kind: str
    """:data:`CONNECTION` or :data:`RECONNECTION`."""
    name: str
    attributes: Attributes


@attrs.frozen(slots=True)
class SpanEnded:
    kind: str
    attributes: Attributes
    """Set on the span just before it ends."""


@attrs.frozen(slots=True)
class SpanDone:
    """A span that starts and ends at once (a snapshot applied, a syncs report)."""

    name: str
    attributes: Attributes


SpanOp = SpanStarted | SpanEnded | SpanDone


@attrs.frozen(slots=True)
class Drained:
    """What a drain reports: histogram records, counter increases, finished spans."""

    reads: tuple[Record, ...] = ()
    ingests: tuple[Record, ...] = ()
    buckets: tuple[Record, ...] = ()
    warm: tuple[Record, ...] = ()
    admissions: tuple[Record, ...] = ()
    spans: tuple[SpanDone, ...] = ()
    overflow: int = 0
    export: bool = False
    """This drain ends an export interval: export what was recorded in it, then forget it."""
    left_out: int = 0
    """Records of the interval that ends here which the series cap left out (with ``export``)."""


class Recorder:
    """Telemetry records of one instance, from its hot paths to the adapter (see the module)."""

    def __init__(
        self, *, export_interval: float = 30.0, cap: int = CAP, series_cap: int = SERIES_CAP
    ) -> None:
        if series_cap < 1:
            raise ValueError("series_cap must be at least 1")
        self._series_cap = series_cap
        self._series: dict[str, set[tuple[Any, ...]]] = {}
        self._left_out = 0
        self._interval_ends: float | None = None
        self._reads: list[tuple[ReadKey, int, str]] = []
        self._tracks: list[tuple[str, tuple[str, ...], int, str, int]] = []
        self._admissions: list[tuple[str, str, tuple[str, ...], int, str]] = []
        self._cap = cap
        self._overflow = 0
        self._interval = export_interval
        self._next_flush = 0.0
        self._next_report = 0.0
        self._reported = (0, 0)
        self._open: set[str] = set()

    @property
    def series_cap(self) -> int:
        """Distinct series per instrument admitted into one export interval."""
        return self._series_cap

    # -- hot paths ------------------------------------------------------------------------------

    def read(self, key: ReadKey, elapsed_ns: int, outcome: str) -> None:
        """A read that was not answered from memory at once (cold, or failed)."""
        if len(self._reads) < self._cap:
            self._reads.append((key, elapsed_ns, outcome))
        else:
            self._overflow += 1

    def tracked(
        self,
        external_customer_id: object,
        customer_id: object,
        meter_ids: tuple[str, ...],
        elapsed_ns: int,
        outcome: str,
        buckets: int = 0,
    ) -> None:
        if len(self._tracks) < self._cap:
            customer = customer_attribute(external_customer_id, customer_id)
            self._tracks.append((customer, meter_ids, elapsed_ns, outcome, buckets))
        else:
            self._overflow += 1

    def admitted(
        self,
        operation: str,
        external_customer_id: object,
        customer_id: object,
        meter_ids: tuple[str, ...],
        elapsed_ns: int,
        outcome: str,
    ) -> None:
        """An admission (``semconv.RESERVE``, ``COMMIT``, ``RELEASE`` or ``TRACK``) ended."""
        if len(self._admissions) < self._cap:
            customer = customer_attribute(external_customer_id, customer_id)
            self._admissions.append((operation, customer, meter_ids, elapsed_ns, outcome))
        else:
            self._overflow += 1

    # -- off the hot paths ----------------------------------------------------------------------

    def due(self, now: float) -> bool:
        """Whether a drain is due at ``now`` (monotonic seconds)."""
        return now >= self._next_flush

    def drain(
        self,
        now: float,
        received: int,
        applied: int,
        warm: Mapping[ReadKey, int] | None = None,
        *,
        force: bool = False,
    ) -> Drained:
        """Everything recorded since the last drain, aggregated, with the warm reads counted
        meanwhile (``warm``); the syncs report when due."""
        self._next_flush = now + FLUSH_EVERY
        reads, self._reads = self._reads, []
        tracks, self._tracks = self._tracks, []
        admissions, self._admissions = self._admissions, []
        overflow, self._overflow = self._overflow, 0
        read_records = tuple(
            Record(
                elapsed / 1e9,
                {
                    semconv.METER: key[0],
                    semconv.CUSTOMER: customer_attribute(key[1], key[2]),
                    semconv.OUTCOME: outcome,
                },
            )
            for key, elapsed, outcome in reads
        )
        ingests: list[Record] = []
        buckets: dict[tuple[str, tuple[str, ...]], int] = {}
        for customer, meters, elapsed, outcome, written in tracks:
            for meter_id in meters or ("",):
                attributes = {
                    semconv.METER: meter_id,
                    semconv.CUSTOMER: customer,
                    semconv.OUTCOME: outcome,
                }
                ingests.append(Record(elapsed / 1e9, attributes))
            if written:
                buckets[(customer, meters)] = buckets.get((customer, meters), 0) + written
        spans: tuple[SpanDone, ...] = ()
        if (received, applied) != self._reported and (now >= self._next_report or force):
            self._next_report = now + self._interval
            syncs = {
                semconv.RECEIVED: received - self._reported[0],
                semconv.APPLIED: applied - self._reported[1],
            }
            spans = (SpanDone(semconv.SPAN_SYNCS, syncs),)
            self._reported = (received, applied)
        if self._interval_ends is None:
            self._interval_ends = now + self._interval
        drained = Drained(
            reads=self._admitted(semconv.READ_DURATION, read_records),
            ingests=self._admitted(semconv.INGEST_DURATION, ingests),
            buckets=self._admitted(
                semconv.BUCKETS_WRITTEN,
                [
                    # A tuple: OpenTelemetry SDKs before 1.45 hash a metric's attributes.
                    Record(n, {semconv.CUSTOMER: customer, semconv.METERS: tuple(meters)})
                    for (customer, meters), n in buckets.items()
                ],
            ),
            warm=self._admitted(
                semconv.READ_WARM,
                [
                    Record(
                        n, {semconv.METER: key[0], semconv.CUSTOMER: customer_attribute(*key[1:])}
                    )
                    for key, n in (warm or {}).items()
                    if n > 0
                ],
            ),
            admissions=self._admitted(
                semconv.ADMISSION_DURATION,
                [
                    Record(
                        elapsed / 1e9,
                        {
                            semconv.METER: meter_id,
                            semconv.CUSTOMER: customer,
                            semconv.OPERATION: operation,
                            semconv.OUTCOME: outcome,
                        },
                    )
                    for operation, customer, meters, elapsed, outcome in admissions
                    for meter_id in meters or ("",)
                ],
            ),
            spans=spans,
            overflow=overflow,
        )
        if not (force or now >= self._interval_ends):
            return drained
        left_out, self._left_out = self._left_out, 0
        self._series = {}
        self._interval_ends = now + self._interval
        return attrs.evolve(drained, export=True, left_out=left_out)

    def _admitted(self, instrument: str, records: Sequence[Record]) -> tuple[Record, ...]:
        """The records whose series fit in this interval's cap; the others are counted."""
        series = self._series.setdefault(instrument, set())
        kept: list[Record] = []
        for record in records:
            key = tuple(tuple(v) if isinstance(v, list) else v for v in record.attributes.values())
            if key not in series:
                if len(series) >= self._series_cap:
                    self._left_out += 1
                    continue
                series.add(key)
            kept.append(record)
        return tuple(kept)

    def observe(self, observations: Sequence[Observation]) -> list[SpanOp]:
        """The spans the core's observations make."""
        ops: list[SpanOp] = []
        for seen in observations:
            if isinstance(seen, SnapshotApplied):
                ops.append(SpanDone(semconv.SPAN_SNAPSHOT, _snapshot_attributes(seen)))
            else:
                ops += self._link(seen)
        return ops

    def _link(self, seen: LinkChanged) -> list[SpanOp]:
        ops: list[SpanOp] = []
        if seen.state == "open":
            if RECONNECTION in self._open:
                ops.append(SpanEnded(RECONNECTION, {semconv.OUTCOME: semconv.OK}))
            if CONNECTION in self._open:  # a close always comes between; stay well-formed
                ops.append(SpanEnded(CONNECTION, {}))
            self._open = {CONNECTION}
            ops.append(
                SpanStarted(
                    CONNECTION, semconv.SPAN_CONNECTION, {"outpost.attempt": seen.connections}
                )
            )
            return ops
        if CONNECTION in self._open:
            ops.append(SpanEnded(CONNECTION, {semconv.REASON: seen.reason or ""}))
            self._open.discard(CONNECTION)
        if RECONNECTION not in self._open:
            self._open.add(RECONNECTION)
            ops.append(
                SpanStarted(
                    RECONNECTION, semconv.SPAN_RECONNECTION, {semconv.REASON: seen.reason or ""}
                )
            )
        return ops

    def close(self) -> list[SpanOp]:
        """The instance closes: end the spans still open."""
        ops: list[SpanOp] = [SpanEnded(kind, {}) for kind in sorted(self._open)]
        self._open.clear()
        return ops


def _snapshot_attributes(seen: SnapshotApplied) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        semconv.CUSTOMER: seen.customer,
        semconv.SNAPSHOT_ID: seen.snapshot_id,
        semconv.COLD_UNTIL: seen.cold_until,
        semconv.COUNTED: seen.counted,
        semconv.METERS: list(seen.meter_ids),
        semconv.LOCAL_CONSUMED: [v if math.isfinite(v) else -1.0 for v in seen.local_consumed],
        semconv.POLAR_CONSUMED: list(seen.polar_consumed),
    }
    if len(seen.meter_ids) == 1:
        attributes[semconv.METER] = seen.meter_ids[0]
    return attributes
