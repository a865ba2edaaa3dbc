"""Polar's limits in the emulator: requests a minute per organization (429), body size (413)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from outpost_emulator import Emulator, EmulatorClock
from outpost_emulator._limits import MAX_BODY_BYTES, RateLimit
from tests.emulator.helpers import START, auth, event


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_sliding_minute_of_admitted_requests() -> None:
    clock = Clock()
    limit = RateLimit(3, clock)
    for _ in range(3):
        assert limit.admit() is None
        clock.now += 10
    assert limit.admit() == 30  # the first leaves the window 60 s after it came in
    clock.now += 30
    assert limit.admit() is None
    assert limit.admit() == 10
    assert limit.to_json() == {"requests_per_minute": 3, "in_window": 3}


def test_zero_disables_the_limit_and_negative_is_refused() -> None:
    limit = RateLimit(0, Clock())
    assert all(limit.admit() is None for _ in range(10_000))
    with pytest.raises(ValueError, match=">= 0"):
        RateLimit(-1)


def test_the_default_is_polar_s_production_limit() -> None:
    assert RateLimit().per_minute == 500


@pytest.fixture
def limited() -> Iterator[Emulator]:
    with Emulator.start(clock=EmulatorClock(START, frozen=True), rate_limit=3) as emulator:
        yield emulator


def test_requests_beyond_the_limit_get_429_with_retry_after(limited: Emulator) -> None:
    with httpx.Client(base_url=limited.url, headers=auth(limited.token), timeout=10) as http:
        assert http.get("/v1/meters/").status_code == 200
        assert http.post("/v1/events/ingest", json={"events": [event()]}).status_code == 200
        assert http.get("/__emulator/state").status_code == 200  # the admin API is not counted
        assert http.get("/v1/customer-meters/").status_code == 200
        refused = http.post("/v1/events/ingest", json={"events": [event()]})
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.json()["error"] == "TooManyRequests"
    state = limited.state()
    assert state["events"]["count"] == 1
    assert state["counters"]["http_rate_limited"] == 1


def test_an_ingestion_body_over_10_mib_gets_413(limited: Emulator) -> None:
    item = json.dumps(event(pad="x" * 1000)).encode()
    count = MAX_BODY_BYTES // (len(item) + 1) + 1
    body = b'{"events":[' + b",".join([item] * count) + b"]}"
    assert len(body) > MAX_BODY_BYTES
    with httpx.Client(base_url=limited.url, headers=auth(limited.token), timeout=30) as http:
        response = http.post(
            "/v1/events/ingest", content=body, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 413
    assert limited.state()["events"]["count"] == 0
