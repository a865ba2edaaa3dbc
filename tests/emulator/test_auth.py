from __future__ import annotations

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from outpost_emulator import Emulator
from tests.emulator.helpers import COUNT_ALL, Ws, auth, event


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ({}, "Unauthorized"),
        ({"Authorization": "Bearer nope"}, "invalid_token"),
        ({"Authorization": "Basic cG9sYXI6eA=="}, "invalid_token"),
        ({"Authorization": "Bearer"}, "invalid_token"),
    ],
)
def test_ingest_without_a_valid_token_is_401(
    emu: Emulator, headers: dict[str, str], error: str
) -> None:
    response = httpx.post(
        f"{emu.url}/v1/events/ingest", json={"events": [event()]}, headers=headers, verify=False
    )
    assert response.status_code == 401
    body = response.json()
    assert isinstance(body["detail"], str)
    assert body["error"] == error
    assert response.headers["WWW-Authenticate"].startswith('Bearer realm="polar"')
    assert emu.state()["events"]["count"] == 0


def test_missing_scope_is_403_on_every_route(emu: Emulator) -> None:
    emu.add_token("polar_oat_readonly", ["events:read"])
    headers = auth("polar_oat_readonly")
    calls = [
        ("POST", "/v1/events/ingest", {"events": [event()]}),
        ("GET", "/v1/meters/", None),
        (
            "POST",
            "/v1/meters/",
            {"name": "m1m", "filter": COUNT_ALL, "aggregation": {"func": "count"}},
        ),
        ("GET", "/v1/customer-meters/", None),
    ]
    for method, path, body in calls:
        response = httpx.request(
            method, f"{emu.url}{path}", json=body, headers=headers, verify=False
        )
        assert response.status_code == 403, (path, response.text)
        assert response.json()["error"] == "insufficient_scope"
        assert isinstance(response.json()["detail"], str)
        assert 'error="insufficient_scope"' in response.headers["WWW-Authenticate"]
    assert emu.state()["events"]["count"] == 0


def test_read_scope_is_enough_to_list_meters(emu: Emulator) -> None:
    emu.add_token("polar_oat_meters", ["meters:read"])
    response = httpx.get(f"{emu.url}/v1/meters/", headers=auth("polar_oat_meters"), verify=False)
    assert response.status_code == 200
    response = httpx.post(
        f"{emu.url}/v1/meters/",
        json={"name": "m1m", "filter": COUNT_ALL, "aggregation": {"func": "count"}},
        headers=auth("polar_oat_meters"),
        verify=False,
    )
    assert response.status_code == 403


def test_custom_token_replaces_the_default() -> None:
    with Emulator.start(token="polar_oat_custom") as emu:
        assert emu.token == "polar_oat_custom"
        ok = httpx.get(f"{emu.url}/v1/meters/", headers=auth("polar_oat_custom"), verify=False)
        assert ok.status_code == 200
        default = httpx.get(f"{emu.url}/v1/meters/", headers=auth("polar_oat_local"), verify=False)
        assert default.status_code == 401


@pytest.mark.parametrize(
    ("token", "status"),
    [(None, 401), ("polar_oat_unknown", 401), ("polar_oat_noscope", 403)],
)
def test_websocket_upgrade_is_refused_with_http_status(
    emu: Emulator, token: str | None, status: int
) -> None:
    emu.add_token("polar_oat_noscope", ["events:read", "meters:read"])
    from websockets.sync.client import connect

    headers = {} if token is None else auth(token)
    with pytest.raises(InvalidStatus) as info, connect(emu.ws_url, additional_headers=headers):
        pass
    assert info.value.response.status_code == status
    assert b'"detail"' in info.value.response.body
    assert emu.state()["counters"]["ws_auth_rejected"] == 1
    assert emu.state()["connections"] == []


def test_websocket_accepts_events_write(emu: Emulator) -> None:
    emu.add_token("polar_oat_writer", ["events:write"])
    with Ws(emu, token="polar_oat_writer") as ws:
        ws.sync_point()


def test_admin_api_needs_no_token(emu: Emulator) -> None:
    assert httpx.get(f"{emu.url}/__emulator/clock", verify=False).status_code == 200
