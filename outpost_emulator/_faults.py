"""Faults a test can inject: failing, hanging or response-losing ingests, and snapshot delays.

Dropping WebSockets and pausing syncs are actions on other parts (connections, pipeline);
this module only keeps what has to be remembered between requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from outpost_emulator._model import JsonObject

IngestFaultKind = Literal["error", "hang", "lose_response"]


@dataclass(slots=True)
class IngestFault:
    kind: IngestFaultKind
    remaining: int
    status: int | None = None  # error: 429, 500 or 503
    retry_after: float | None = None  # error: the Retry-After header, in seconds
    seconds: float = 0.0  # hang: wall-clock seconds before processing

    def to_json(self) -> JsonObject:
        data: JsonObject = {"kind": self.kind, "remaining": self.remaining}
        if self.kind == "error":
            data.update(status=self.status, retry_after=self.retry_after)
        if self.kind == "hang":
            data["seconds"] = self.seconds
        return data


class Faults:
    def __init__(self) -> None:
        self.ingest: list[IngestFault] = []
        self.snapshot_delay_s = 0.0

    def add(self, fault: IngestFault) -> None:
        if fault.remaining > 0:
            self.ingest.append(fault)

    def take(self, kind: IngestFaultKind) -> IngestFault | None:
        """Use one of the oldest pending fault of this kind, if any."""
        for fault in self.ingest:
            if fault.kind == kind:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self.ingest.remove(fault)
                return fault
        return None

    def clear(self) -> None:
        self.ingest.clear()
        self.snapshot_delay_s = 0.0

    def to_json(self) -> JsonObject:
        return {
            "ingest": [f.to_json() for f in self.ingest],
            "snapshot_delay_s": self.snapshot_delay_s,
        }
