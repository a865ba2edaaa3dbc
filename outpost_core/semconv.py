"""Telemetry names shared by both drivers (and the TypeScript SDK): instruments, spans and the
attributes they carry. Records name the meter and the customer identity; never an event's
metadata, never the access token."""

from __future__ import annotations

INSTRUMENTATION = "outpost"

INGEST_DURATION = "outpost.ingest.duration"
"""Histogram, seconds: one record per local write (``track()``), with its outcome."""
READ_DURATION = "outpost.read.duration"
"""Histogram, seconds: one record per read (``balance()``) that memory did not answer at once,
with its outcome (``cold`` or why it failed)."""
DURATION_BOUNDARIES = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
"""The bucket boundaries of both duration histograms, seconds: 0.1 ms to 1 s, as Polar's
prototype had them. OpenTelemetry's default boundaries (0, 5, 10, ... 10,000) are for
milliseconds: in seconds, every write and read fell in the first bucket, and no percentile could
be read from them."""
ADMISSION_DURATION = "outpost.admission.duration"
"""Histogram, seconds: one record per admission (``reserve()``, a reservation's commit or
release, ``track(require_balance=True)``), with its operation and outcome: how often customers
are refused, and what exact admission costs."""
READ_WARM = "outpost.read.warm"
"""Counter: reads answered from memory (outcome ``warm``), counted rather than timed: a warm read
costs well under a microsecond, and timing each one would cost as much as the read."""
BUCKETS_WRITTEN = "outpost.buckets.written"
"""Counter: bucket aggregates written by ``track()`` (one per reducer the event counts in)."""
SERIES_LEFT_OUT = "outpost.telemetry.left_out"
"""Counter, no attributes: records of one export interval left out because their instrument
already had as many distinct series (meter, customer, outcome) in it as the cap allows."""

SPAN_SYNCS = "outpost.syncs"
"""Span per report of the snapshots (Polar's syncs) received and applied since the last one."""
SPAN_CONNECTION = "outpost.connection"
"""Span per WebSocket connection to Polar, from the attempt to its end."""
SPAN_RECONNECTION = "outpost.reconnection"
"""Span from a lost connection to the next open one."""
SPAN_SNAPSHOT = "outpost.snapshot.received"
"""Span per snapshot applied, with the local and Polar totals it replaced."""

METER = "outpost.meter_id"
METERS = "outpost.meter_ids"
CUSTOMER = "outpost.customer"
"""``external:<id>`` or ``customer:<uuid>``: the identity as the merchant names it."""
OUTCOME = "outpost.outcome"
OPERATION = "outpost.admission.operation"
"""``reserve``, ``commit``, ``release`` or ``track`` (a track with ``require_balance``)."""
SNAPSHOT_ID = "outpost.snapshot_id"
COLD_UNTIL = "outpost.cold_until"
LOCAL_CONSUMED = "outpost.local.consumed"
"""Per meter (same order as ``outpost.meter_ids``): the local consumption the snapshot replaced."""
POLAR_CONSUMED = "outpost.polar.consumed"
"""Per meter: the consumption after the snapshot (Polar's totals plus what it does not count)."""
COUNTED = "outpost.snapshot.counted"
RECEIVED = "outpost.syncs.received"
APPLIED = "outpost.syncs.applied"
REASON = "outpost.reason"
ORGANIZATION = "polar.organization_id"
SDK_VERSION = "outpost.sdk.version"

# Outcomes
OK = "ok"
WARM = "warm"
COLD = "cold"
INVALID = "invalid"
NOT_READY = "not_ready"
REDIS_ERROR = "redis_error"
UNKNOWN_METER = "unknown_meter"
UNSUPPORTED_METER = "unsupported_meter"
INSUFFICIENT_BALANCE = "insufficient_balance"
CANNOT_ADMIT = "cannot_admit"

# Admission operations
RESERVE = "reserve"
COMMIT = "commit"
RELEASE = "release"
TRACK = "track"
