"""What a driver's telemetry uses from the core: the recorder the core fills as it works, what
it drains, and the span and read records it hands over (``docs/telemetry.md``)."""

from __future__ import annotations

from ._observations import Observation
from ._telemetry import (
    SERIES_CAP,
    Drained,
    ReadKey,
    Recorder,
    SpanDone,
    SpanOp,
    SpanStarted,
    admission_outcome,
    read_outcome,
    track_outcome,
)

__all__ = [
    "SERIES_CAP",
    "Drained",
    "Observation",
    "ReadKey",
    "Recorder",
    "SpanDone",
    "SpanOp",
    "SpanStarted",
    "admission_outcome",
    "read_outcome",
    "track_outcome",
]
