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
    json_type = {"content-type": "application/json"}
    assert admin.post("/clock", content=b"{oops", headers=json_type).status_code == 422
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


# -- a local tool: a web page cannot drive it -----------------------------------------------------


def test_admin_posts_must_be_json(emu: Emulator, admin: httpx.Client) -> None:
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        refused = admin.post("/credits", content=b'{"units": 5}', headers={"content-type": kind})
        assert refused.status_code == 403
        assert "JSON bodies only" in refused.json()["detail"]
    assert admin.post("/clock", content=b"{}").status_code == 403  # no Content-Type at all


@pytest.mark.parametrize(
    "origin", ["http://evil.example", "https://127.0.0.1.evil.example", "null"]
)
def test_admin_refuses_a_page_of_another_origin(admin: httpx.Client, origin: str) -> None:
    refused = admin.post("/clock", json={"advance": 1}, headers={"origin": origin})
    assert refused.status_code == 403 and "page" in refused.json()["detail"]
    assert admin.get("/state", headers={"origin": origin}).status_code == 403


def test_admin_answers_its_own_pages_and_loopback_origins(
    emu: Emulator, admin: httpx.Client
) -> None:
    for origin in (emu.url, "http://localhost:3000", "http://[::1]:5173"):
        assert (
            admin.post("/clock", json={"advance": 1}, headers={"origin": origin}).status_code == 200
        )


def test_admin_refuses_a_host_that_is_not_loopback(emu: Emulator, admin: httpx.Client) -> None:
    # a page whose own name was rebound to 127.0.0.1 still sends that name
    headers = {
        "host": f"rebound.example:{emu.port}",
        "origin": f"http://rebound.example:{emu.port}",
    }
    refused = admin.post("/clock", json={"advance": 1}, headers=headers)
    assert refused.status_code == 403 and "--allow-remote" in refused.json()["detail"]
    emu._hub.remote_admin = True  # --allow-remote
    assert admin.post("/clock", json={"advance": 1}, headers=headers).status_code == 200


def test_a_non_loopback_host_needs_allow_remote(capsys: pytest.CaptureFixture[str]) -> None:
    from outpost_emulator.cli import main

    assert main(["emulator", "--host", "0.0.0.0"]) == 2
    assert "--allow-remote" in capsys.readouterr().err


def test_a_missing_module_of_the_extra_is_named_with_how_to_install_it() -> None:
    from outpost_emulator.cli import missing_extra

    assert missing_extra("emulator") is None  # starlette and uvicorn come with the test setup
    problem = missing_extra("demo", ("uvicorn", "outpost_not_a_module"))
    assert problem == (
        "outpost demo: outpost_not_a_module not installed; they come with the emulator extra: "
        "pip install 'polar-outpost[emulator]'"
    )
