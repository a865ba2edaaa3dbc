"""Writing conformance traces (opt-in, ``record_to=``): the core records, this file writes."""

from __future__ import annotations

import json
import os
import random
import threading
from pathlib import Path
from typing import IO, Any, cast

from outpost_core import Delivery, DeliverySettings, Session, Settings
from outpost_core.traces import RecordingDelivery, RecordingSession, TraceRecord, header


class Traces:
    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self._directory = Path(directory) if directory is not None else None
        self._seed = random.SystemRandom().randrange(2**32)
        self._files: list[IO[str]] = []
        self._lock = threading.Lock()
        if self._directory is not None:
            self._directory.mkdir(parents=True, exist_ok=True)

    def rng(self, stream: int) -> random.Random:
        """The generator of one machine: seeded, and the seed is in its trace's header."""
        return random.Random(self._seed + stream)

    def session(self, session: Session, settings: Settings, server_url: str | None) -> Session:
        if self._directory is None:
            return session
        sink = self._open("session.jsonl", header("session", settings, self._seed, {
            "server_url": server_url,
        }))  # fmt: skip
        return cast(Session, RecordingSession(session, sink))  # same surface, recorded

    def delivery(
        self, n: int, delivery: Delivery, settings: DeliverySettings, started: float
    ) -> Delivery:
        if self._directory is None:
            return delivery
        head = header("delivery", settings, self._seed + n + 1, {"started_at": started})
        recording = RecordingDelivery(delivery, self._open(f"delivery-{n}.jsonl", head))
        return cast(Delivery, recording)  # same surface, recorded

    def _open(self, name: str, head: TraceRecord) -> Any:
        assert self._directory is not None
        file = (self._directory / name).open("w", encoding="utf-8")
        self._files.append(file)
        lock = threading.Lock()

        def sink(record: TraceRecord) -> None:
            with lock:
                file.write(json.dumps(record, separators=(",", ":")) + "\n")
                file.flush()

        sink(head)
        return sink

    def close(self) -> None:
        for file in self._files:
            file.close()
        self._files.clear()
