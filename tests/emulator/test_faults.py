from __future__ import annotations

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from outpost_emulator import Emulator
from tests.emulator.helpers import B1500, COUNT_ALL, MIN_US, Ws, event, ingest, ingest_ok, wait_for


def test_rate_limited_with_retry_after(emu: Emulator, http: httpx.Client) -> None:
    emu.fault_ingest_error(429, count=2)
    for _ in range(2):
        response = ingest(http, event(id="e1"))
        assert response.status_code == 429
        assert response.headers["Retry-After"] == "1"
        assert isinstance(response.json()["detail"], str)
    assert emu.state()["events"]["count"] == 0
    assert ingest_ok(http, event(id="e1")) == {"inserted": 1, "duplicates": 0}


@pytest.mark.parametrize(
    ("status", "retry_after", "header"),
    [(500, None, None), (503, None, None), (503, 2.5, "2.5"), (429, 30, "30")],
)
def test_error_statuses(
    emu: Emulator, http: httpx.Client, status: int, retry_after: float | None, header: str | None
) -> None:
    emu.fault_ingest_error(status, retry_after=retry_after)
    response = ingest(http, event())
    assert response.status_code == status
    assert response.headers.get("Retry-After") == header
    assert ingest(http, event()).status_code == 200


def test_faults_apply_only_to_authenticated_ingests(emu: Emulator, http: httpx.Client) -> None:
    emu.fault_ingest_error(503)
    assert http.get("/v1/meters/").status_code == 200
    unauthenticated = httpx.post(f"{emu.url}/v1/events/ingest", json={"events": []}, verify=False)
    assert unauthenticated.status_code == 401
    assert ingest(http).status_code == 503


def test_hang_then_process(emu: Emulator, http: httpx.Client) -> None:
    emu.fault_ingest_hang(1.0)
    with pytest.raises(httpx.ReadTimeout):
        http.post("/v1/events/ingest", json={"events": [event(id="slow")]}, timeout=0.1)
    # The request goes on after its hang and is stored, though nobody reads the answer.
    wait_for(lambda: emu.state()["events"]["count"] == 1, "the hung ingest to finish")
    assert ingest_ok(http, event(id="slow")) == {"inserted": 0, "duplicates": 1}


def test_lost_response(emu: Emulator, http: httpx.Client) -> None:
    emu.fault_ingest_lose_response(count=1)
    with pytest.raises(httpx.RemoteProtocolError):
        ingest(http, event(id="e1"), event(id="e2"))
    assert emu.state()["events"]["count"] == 2  # processed before the connection dropped
    # The SDK's retry of the same batch finds both as duplicates.
    assert ingest_ok(http, event(id="e1"), event(id="e2")) == {"inserted": 0, "duplicates": 2}
    assert emu.state()["counters"]["ingest_responses_lost"] == 1


def test_drop_websockets_with_close_code(emu: Emulator) -> None:
    with Ws(emu) as first, Ws(emu) as second:
        first.sync_point()
        second.sync_point()
        emu.fault_drop_websockets("close")
        for client in (first, second):
            with pytest.raises(ConnectionClosed) as info:
                client.recv()
            assert info.value.rcvd is not None
            assert info.value.rcvd.code == 1012
    wait_for(lambda: emu.state()["connections"] == [], "the server to forget the sockets")
    with Ws(emu) as again:  # reconnecting works
        again.sync_point()


def test_drop_websockets_abort(emu: Emulator) -> None:
    with Ws(emu) as ws:
        ws.sync_point()
        emu.fault_drop_websockets("abort")
        with pytest.raises(ConnectionClosed) as info:
            ws.recv()
        assert info.value.rcvd is None  # no close frame: the TCP connection just ended
    wait_for(lambda: emu.state()["connections"] == [], "the server to forget the socket")


def test_snapshot_delay(emu: Emulator, http: httpx.Client, ws: Ws) -> None:
    meter = emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ws.expect("configuration")
    emu.fault_snapshot_delay(0.4)
    ws.send("snapshot", request_id="slow", external_customer_id="c1")
    ws.send("configuration")
    ws.expect("configuration")  # answered while the snapshot waits
    snap = ws.expect("snapshot")
    assert snap["request_id"] == "slow"
    ingest_ok(http, event(at=B1500 - MIN_US))
    ws.send("configuration")
    ws.expect("configuration")
    pushed = ws.expect("snapshot")  # pushes are delayed too
    assert pushed["reducers"][next(iter(pushed["reducers"]))]["count"] == 1
    emu.fault_snapshot_delay(0)
    assert ws.snapshot(external_customer_id="c1")["credited"] == {meter["id"]: 0}


def test_clear_removes_every_fault(emu: Emulator, http: httpx.Client, ws: Ws) -> None:
    emu.fault_ingest_error(500, count=5)
    emu.fault_ingest_hang(5, count=5)
    emu.fault_ingest_lose_response(count=5)
    emu.fault_snapshot_delay(30)
    emu.fault_pause_syncs()
    state = emu.state()["faults"]
    assert len(state["ingest"]) == 3 and state["syncs_paused"] and state["snapshot_delay_s"] == 30
    cleared = emu.fault_clear()
    assert cleared == {
        "ingest": [],
        "snapshot_delay_s": 0.0,
        "syncs_paused": False,
        "webhooks": {"drop": 0, "delay_s": 0.0, "delay_count": 0},
        "replica_lag_s": 0.0,
    }
    assert ingest(http, event()).status_code == 200
    ws.snapshot(external_customer_id="c1")


@pytest.mark.parametrize(
    "body",
    [
        {"ingest_error": {"status": 200}},
        {"ingest_error": {"status": 500, "count": 0}},
        {"ingest_error": {"status": 503, "retry_after": -1}},
        {"ingest_hang": {"count": 1}},
        {"ingest_hang": {"seconds": "1"}},
        {"ingest_lose_response": 3},
        {"drop_websockets": "explode"},
        {"syncs": "stop"},
        {"snapshot_delay": -1},
        {"clear": "yes"},
        {"unknown": 1},
        {"webhook_drop": {"count": 0}},
        {"webhook_delay": {"count": 1}},
        {"replica_lag": -1},
    ],
)
def test_bad_fault_requests_change_nothing(admin: httpx.Client, body: dict[str, object]) -> None:
    response = admin.post("/faults", json={"snapshot_delay": 3, **body})
    assert response.status_code == 422, response.text
    assert admin.get("/faults").json() == {
        "ingest": [],
        "snapshot_delay_s": 0.0,
        "syncs_paused": False,
        "webhooks": {"drop": 0, "delay_s": 0.0, "delay_count": 0},
        "replica_lag_s": 0.0,
    }


def test_faults_over_http(admin: httpx.Client, http: httpx.Client) -> None:
    response = admin.post("/faults", json={"ingest_error": {"status": 503, "retry_after": 4}})
    assert response.json()["ingest"] == [
        {"kind": "error", "remaining": 1, "status": 503, "retry_after": 4.0}
    ]
    assert ingest(http).headers["Retry-After"] == "4"
    assert admin.post("/faults", json={"syncs": "pause"}).json()["syncs_paused"]
    assert not admin.post("/faults", json={"syncs": "resume"}).json()["syncs_paused"]
