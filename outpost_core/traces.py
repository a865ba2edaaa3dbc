"""Conformance traces: what a driver records (``record_to=``) and how a trace is replayed
against the core to check that it does the same again (``conformance/README.md``)."""

from __future__ import annotations

from ._trace import (
    FORMAT,
    VERSION,
    Mismatch,
    RecordingDelivery,
    RecordingSession,
    TraceRecord,
    header,
    replay_delivery,
    replay_session,
)

__all__ = [
    "FORMAT",
    "VERSION",
    "Mismatch",
    "RecordingDelivery",
    "RecordingSession",
    "TraceRecord",
    "header",
    "replay_delivery",
    "replay_session",
]
