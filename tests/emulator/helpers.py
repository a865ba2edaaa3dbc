"""Clients and waits for the emulator tests: real HTTP (httpx) and WebSocket (websockets)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
from websockets.sync.client import ClientConnection, connect

from outpost_emulator import Emulator

T = TypeVar("T")

# 2026-12-02 15:02:00 UTC: two minutes into the bucket that starts at 15:00.
START = datetime(2026, 12, 2, 15, 2, 0, tzinfo=UTC)
START_US = 1_796_223_720_000_000
BUCKET_US = 300_000_000
MIN_US = 60_000_000
B1500 = START_US - 2 * MIN_US  # the current bucket at START
COUNT_ALL = {"conjunction": "and", "clauses": []}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def iso(t_us: int) -> str:
    return datetime.fromtimestamp(t_us / 1_000_000, UTC).isoformat().replace("+00:00", "Z")


def event(
    name: str = "api_call",
    *,
    ext: str | None = "c1",
    customer_id: str | None = None,
    id: str | None = None,
    at: int | None = None,
    **metadata: Any,
) -> dict[str, Any]:
    """One ingest event; `at` is a µs timestamp (default: the emulator's now)."""
    body: dict[str, Any] = {"name": name, "metadata": metadata}
    if ext is not None:
        body["external_customer_id"] = ext
    if customer_id is not None:
        body["customer_id"] = customer_id
    if id is not None:
        body["external_id"] = id
    if at is not None:
        body["timestamp"] = iso(at)
    return body


def ingest(http: httpx.Client, *events: dict[str, Any]) -> httpx.Response:
    return http.post("/v1/events/ingest", json={"events": list(events)})


def ingest_ok(http: httpx.Client, *events: dict[str, Any]) -> dict[str, Any]:
    response = ingest(http, *events)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def clause(prop: str, op: str, value: Any) -> dict[str, Any]:
    return {"property": prop, "operator": op, "value": value}


def where(*clauses: dict[str, Any], conjunction: str = "and") -> dict[str, Any]:
    return {"conjunction": conjunction, "clauses": list(clauses)}


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 5.0) -> T:
    """Poll a condition until it holds (returns a truthy value) or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def reducer_of(emu: Emulator, meter_id: str) -> str:
    for reducer in emu.state()["reducers"]:
        if meter_id in reducer["meter_ids"]:
            return str(reducer["id"])
    raise AssertionError(f"no reducer for meter {meter_id}")


class Ws:
    """A WebSocket client speaking the Outpost frames."""

    def __init__(self, emu: Emulator, token: str | None = None) -> None:
        self._cm = connect(emu.ws_url, additional_headers=auth(token or emu.token))
        self.conn: ClientConnection = self._cm.__enter__()
        self._n = 0

    def close(self) -> None:
        self._cm.__exit__(None, None, None)

    def __enter__(self) -> Ws:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, type_: str, **payload: Any) -> None:
        self.conn.send(json.dumps({"type": type_, "payload": payload}))

    def send_raw(self, data: str | bytes) -> None:
        self.conn.send(data)

    def recv(self, timeout: float = 5.0) -> dict[str, Any]:
        message: dict[str, Any] = json.loads(self.conn.recv(timeout=timeout))
        return message

    def expect(self, type_: str, timeout: float = 5.0) -> dict[str, Any]:
        message = self.recv(timeout)
        assert message["type"] == type_, message
        payload: dict[str, Any] = message["payload"]
        return payload

    def request_id(self) -> str:
        self._n += 1
        return f"r{self._n}"

    def snapshot(self, **identity: str) -> dict[str, Any]:
        request_id = self.request_id()
        self.send("snapshot", request_id=request_id, **identity)
        payload = self.expect("snapshot")
        assert payload["request_id"] == request_id
        return payload

    def counted(self, snapshot_id: str, event_ids: list[str]) -> list[str]:
        request_id = self.request_id()
        self.send("counted", request_id=request_id, snapshot_id=snapshot_id, event_ids=event_ids)
        payload = self.expect("counted")
        assert payload["request_id"] == request_id
        assert payload["snapshot_id"] == snapshot_id
        ids: list[str] = payload["event_ids"]
        return ids

    def sync_point(self) -> None:
        """Round trip: everything the emulator queued for us before now is received first."""
        self.send("configuration")
        self.expect("configuration")
