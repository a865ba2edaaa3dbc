"""Open WebSocket connections: what each is subscribed to, and its outgoing queue.

Every frame goes through one writer task per connection (see _websocket.py), so pushes from
anywhere in the emulator never interleave with replies mid-frame, and a close is just the last
item of the queue.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass

from outpost_emulator._model import Identity, JsonObject


@dataclass(frozen=True, slots=True)
class CloseRequest:
    code: int


@dataclass(frozen=True, slots=True)
class RawFrame:
    """A frame sent as it is (fault injection): text that need not be JSON, or binary."""

    data: str | bytes


Outgoing = str | CloseRequest | RawFrame
_ids = itertools.count(1)


class Connection:
    def __init__(self, client: tuple[str, int] | None, abort: Callable[[], bool]) -> None:
        self.id = next(_ids)
        self.client = client
        self.queue: asyncio.Queue[Outgoing] = asyncio.Queue()
        # normalized identity -> the value the client used (echoed in its snapshots)
        self.subscriptions: dict[Identity, str] = {}
        self._abort = abort
        self._timers: set[asyncio.TimerHandle] = set()
        self.frames_in = 0
        self.frames_out = 0

    def send(self, message: JsonObject, delay_s: float = 0.0) -> None:
        text = json.dumps(message, separators=(",", ":"))
        if delay_s <= 0:
            self.queue.put_nowait(text)
            return
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def deliver() -> None:
            self._timers.discard(handle)
            self.queue.put_nowait(text)

        handle = loop.call_later(delay_s, deliver)
        self._timers.add(handle)

    def send_raw(self, data: str | bytes) -> None:
        self.queue.put_nowait(RawFrame(data))

    def close(self, code: int) -> None:
        self.queue.put_nowait(CloseRequest(code))

    def abort(self) -> bool:
        """Drop the TCP connection without a close frame; False if the server cannot."""
        return self._abort()

    def teardown(self) -> None:
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "client": None if self.client is None else f"{self.client[0]}:{self.client[1]}",
            "subscriptions": [{kind: value} for (kind, _), value in self.subscriptions.items()],
            "frames_in": self.frames_in,
            "frames_out": self.frames_out,
        }


class Connections:
    def __init__(self) -> None:
        self._open: dict[int, Connection] = {}

    def add(self, connection: Connection) -> None:
        self._open[connection.id] = connection

    def remove(self, connection: Connection) -> None:
        self._open.pop(connection.id, None)
        connection.teardown()

    def all(self) -> list[Connection]:
        return list(self._open.values())

    def __len__(self) -> int:
        return len(self._open)
