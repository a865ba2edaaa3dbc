from __future__ import annotations

import base64

import httpx
import pytest

from outpost_emulator import Emulator
from tests.emulator.helpers import START_US, auth


def test_clock_over_http(emu: Emulator, admin: httpx.Client) -> None:
    assert admin.get("/clock").json() == {
        "now": "2026-12-02T15:02:00Z",
        "now_us": START_US,
        "speed": 1.0,
        "frozen": True,
    }
    assert admin.post("/clock", json={"advance": 90}).json()["now_us"] == START_US + 90_000_000
    moved = admin.post("/clock", json={"set": "2026-12-02T16:00:00+01:00"}).json()
    assert moved["now"] == "2026-12-02T15:00:00Z"
    assert admin.post("/clock", json={"speed": 4}).json()["speed"] == 4.0
    running = admin.post("/clock", json={"freeze": False}).json()
    assert running["frozen"] is False
    assert emu.clock.now_us() >= running["now_us"]
    assert admin.post("/clock", json={"freeze": True}).json()["frozen"] is True


@pytest.mark.parametrize(
    "body",
    [
        {"advance": -1},
        {"advance": "10"},
        {"advance": True},
        {"set": "2026-12-02T15:00:00"},
        {"set": "yesterday"},
        {"speed": 0.5},
        {"freeze": "yes"},
        {"rewind": 5},
    ],
)
def test_bad_clock_requests(admin: httpx.Client, body: dict[str, object]) -> None:
    response = admin.post("/clock", json=body)
    assert response.status_code == 422
    assert isinstance(response.json()["detail"], str)
    assert admin.get("/clock").json()["now_us"] == START_US


def test_customers(admin: httpx.Client) -> None:
    anonymous = admin.post("/customers", json={}).json()
    assert anonymous["external_id"] is None
    acme = admin.post("/customers", json={"external_id": "acme"})
    assert acme.status_code == 200
    assert acme.json()["id"] != anonymous["id"]
    assert admin.post("/customers", json={"external_id": "acme"}).status_code == 409
    assert admin.post("/customers", json={"external_id": 5}).status_code == 422
    assert admin.post("/customers").status_code == 200  # no body: no external id


def test_tokens(emu: Emulator, admin: httpx.Client) -> None:
    added = admin.post("/tokens", json={"token": "polar_oat_x", "scopes": ["meters:read"]})
    assert added.json() == {"token": "polar_oat_x", "scopes": ["meters:read"]}
    assert (
        httpx.get(f"{emu.url}/v1/meters/", headers=auth("polar_oat_x"), verify=False).status_code
        == 200
    )
    assert admin.post("/tokens", json={"token": "", "scopes": []}).status_code == 422
    assert admin.post("/tokens", json={"token": "t", "scopes": "meters:read"}).status_code == 422


def test_state_dump(emu: Emulator, admin: httpx.Client) -> None:
    state = admin.get("/state").json()
    assert set(state) >= {
        "now", "now_us", "events", "customers", "meters", "reducers", "pipeline", "cold_until",
        "credits", "connections", "faults", "counters",
    }  # fmt: skip
    assert set(state["pipeline"]) >= {"rows", "synced_until", "sealed_until", "cold_until"}
    assert state["events"] == {"count": 0, "current": 0, "waiting": 0, "counted": 0}
    assert state == emu.state() | {"counters": state["counters"]}


def test_unknown_admin_routes(admin: httpx.Client) -> None:
    assert admin.get("/nothing").status_code == 404
    assert admin.get("/credits").status_code == 405
    assert admin.post("/clock", content=b"{oops").status_code == 422
    assert admin.post("/clock", json=[1]).status_code == 422


def test_telemetry_relay(emu: Emulator, http: httpx.Client) -> None:
    payload = b"\x0a\x03abc"
    response = http.post(
        "/v1/outpost/telemetry/v1/metrics",
        content=payload,
        headers={"content-type": "application/x-protobuf"},
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-protobuf"
    http.post(
        "/v1/outpost/telemetry/v1/traces",
        content=b"{}",
        headers={"content-type": "application/json"},
    )
    dump = emu.telemetry()
    assert [base64.b64decode(m["body_base64"]) for m in dump["metrics"]] == [payload]
    assert len(dump["traces"]) == 1
    anonymous = httpx.post(
        f"{emu.url}/v1/outpost/telemetry/v1/metrics", content=payload, verify=False
    )
    assert anonymous.status_code == 401
    assert http.post("/v1/outpost/telemetry/v1/logs", content=b"").status_code == 404


def test_polar_routes_answer_json_errors(http: httpx.Client) -> None:
    missing = http.get("/v1/nothing")
    assert missing.status_code == 404
    assert missing.json() == {"detail": "Not Found"}
    assert http.get("/v1/events/ingest").status_code == 405
