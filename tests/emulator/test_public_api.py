"""The emulator's public-API mode: Polar's public behaviour, over real HTTP on loopback."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from websockets.sync.client import connect

from outpost_core._public_readings import parse_state_changed
from outpost_core._webhook_signature import secret_key, verify
from outpost_emulator import Emulator, EmulatorClock
from tests.emulator.helpers import COUNT_ALL, START, START_US, auth, event, ingest_ok, iso, wait_for
from tests.support.webhook_receiver import Receiver

S = 1_000_000


@pytest.fixture
def pub() -> Iterator[Emulator]:
    with Emulator.start(clock=EmulatorClock(START, frozen=True), public_only=True) as emulator:
        yield emulator


@pytest.fixture
def client(pub: Emulator) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=pub.url, headers=auth(pub.token), timeout=10) as c:
        yield c


def rows(client: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    response = client.get("/v1/customer-meters/", params={"limit": 100, **params})
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def only_row(client: httpx.Client, meter_id: str, ext: str) -> dict[str, Any]:
    found = rows(client, meter_id=meter_id, external_customer_id=ext)
    assert len(found) == 1, found
    return found[0]


def test_no_outpost_protocol(pub: Emulator, client: httpx.Client) -> None:
    response = client.post("/v1/outpost/telemetry/v1/metrics", content=b"")
    assert response.status_code == 404
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        connect(pub.ws_url, additional_headers=auth(pub.token))
    assert refused.value.response.status_code == 404


def test_snapshot_mode_still_serves_the_websocket() -> None:
    with (
        Emulator.start(clock=EmulatorClock(START, frozen=True)) as emulator,
        connect(emulator.ws_url, additional_headers=auth(emulator.token)) as ws,
    ):
        ws.send(json.dumps({"type": "configuration", "payload": {}}))
        assert json.loads(ws.recv(timeout=5))["type"] == "configuration"


def test_consumption_recomputed_15s_after_the_last_ingest(
    pub: Emulator, client: httpx.Client
) -> None:
    meter = pub.create_meter("calls", COUNT_ALL, {"func": "count"})
    pub.create_customer("acme")
    pub.advance(20)  # the customer's creation job made its rows: never updated, NULL modified_at
    row = only_row(client, meter["id"], "acme")
    assert (row["consumed_units"], row["modified_at"]) == (0, None)

    ingest_ok(client, event(ext="acme", id="e1"))
    # Activation moves modified_at without recomputing: the trap a reader must survive.
    row = only_row(client, meter["id"], "acme")
    assert row["consumed_units"] == 0
    assert row["modified_at"] == iso(START_US + 20 * S)
    assert pub.customer_meter(meter["id"], external_customer_id="acme")["consumed_units"] == 1

    pub.advance(10)
    ingest_ok(client, event(ext="acme", id="e2"))
    pub.advance(14.9)
    assert only_row(client, meter["id"], "acme")["consumed_units"] == 0
    pub.advance(0.2)  # 15 s after the last ingest
    row = only_row(client, meter["id"], "acme")
    assert row["consumed_units"] == 2
    assert row["modified_at"] == iso(START_US + 45 * S)
    assert row["balance"] == -2


def test_continuous_traffic_recomputes_only_at_the_maximum() -> None:
    clock = EmulatorClock(START, frozen=True)
    with (
        Emulator.start(clock=clock, public_only=True, recompute_delays=(15, 600)) as emu,
        httpx.Client(base_url=emu.url, headers=auth(emu.token), timeout=10) as client,
    ):
        meter = emu.create_meter("calls", COUNT_ALL, {"func": "count"})
        ingest_ok(client, event(ext="c1", id="first"))
        emu.advance(15)
        assert only_row(client, meter["id"], "c1")["consumed_units"] == 1
        recomputed: list[float] = []
        for n in range(130):  # one event every 10 s for over 20 minutes
            emu.advance(10)
            ingest_ok(client, event(ext="c1", id=f"e{n}"))
            row = only_row(client, meter["id"], "c1")
            if row["consumed_units"] != (recomputed[-1] if recomputed else 1):
                recomputed.append(row["consumed_units"])
        # Each burst's first enqueue (+25 s, then +635 s) is the oldest; the first message that
        # runs more than 600 s after it executes (+630 s with 62 events, +1240 s with 123).
        assert recomputed == [62, 123]
        assert emu.state()["public"]["recomputes"] == 3


def test_credits_cycles_and_revokes_apply_at_once(pub: Emulator, client: httpx.Client) -> None:
    meter = pub.create_meter("calls", COUNT_ALL, {"func": "count"})
    customer = pub.create_customer("acme")
    pub.grant_credits(meter["id"], 100, customer_id=customer["id"])
    row = only_row(client, meter["id"], "acme")
    assert (row["credited_units"], row["consumed_units"]) == (100, 0)
    assert row["modified_at"] == iso(START_US)

    ingest_ok(client, event(ext="acme", id="a"), event(ext="acme", id="b"))
    pub.advance(15)
    assert only_row(client, meter["id"], "acme")["balance"] == 98

    pub.grant_credits(meter["id"], -30, customer_id=customer["id"])  # a revoke
    assert only_row(client, meter["id"], "acme")["credited_units"] == 70

    pub.advance(60)
    answer = pub.cycle(meter["id"], 50, rollover_units=5, customer_id=customer["id"])
    assert (answer["consumed_units"], answer["credited_units"]) == (0, 55)
    row = only_row(client, meter["id"], "acme")
    assert (row["consumed_units"], row["credited_units"]) == (0, 55)
    assert row["modified_at"] == iso(START_US + 75 * S)


def test_a_customer_created_later_takes_over_the_rows(pub: Emulator, client: httpx.Client) -> None:
    meter = pub.create_meter("calls", COUNT_ALL, {"func": "count"})
    ingest_ok(client, event(ext="late", id="1"))
    pub.advance(15)
    customer = pub.create_customer("late")
    [row] = rows(client, meter_id=meter["id"])
    assert (row["customer_id"], row["consumed_units"]) == (customer["id"], 1)


def test_admin_answers_the_true_balance(pub: Emulator, client: httpx.Client) -> None:
    meter = pub.create_meter("tokens", COUNT_ALL, {"func": "sum", "property": "n"})
    ingest_ok(client, event(ext="c1", id="a", n=5))
    pub.advance(15)
    ingest_ok(client, event(ext="c1", id="b", n=7))
    assert only_row(client, meter["id"], "c1")["consumed_units"] == 5
    assert pub.customer_meter(meter["id"], external_customer_id="c1")["consumed_units"] == 12


def test_rows_sort_by_modified_at_descending_nulls_first(
    pub: Emulator, client: httpx.Client
) -> None:
    meter = pub.create_meter("calls", COUNT_ALL, {"func": "count"})
    pub.create_customer("never")
    ingest_ok(client, event(ext="old", id="1"))
    pub.advance(20)
    ingest_ok(client, event(ext="new", id="2"))
    pub.advance(20)
    order = [r["external_customer_id"] for r in rows(client, meter_id=meter["id"])]
    assert order == ["never", "new", "old"]


def _verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(sig.split(",", 1)[1] == expected for sig in headers["webhook-signature"].split(" "))


def test_state_changed_webhook_signed_and_debounced(
    pub: Emulator, client: httpx.Client, receiver: Receiver
) -> None:
    meter = pub.create_meter("calls", COUNT_ALL, {"func": "count"})
    endpoint = pub.register_webhook(receiver.url)
    assert endpoint["secret"].startswith("whsec_")
    ingest_ok(client, event(ext="acme", id="1"), event(ext="acme", id="2"))
    pub.advance(15)  # recompute, then the webhook job waits its 1 s debounce
    assert receiver.requests == []
    pub.advance(1)
    wait_for(lambda: receiver.requests, "the webhook")
    headers, body = receiver.requests[0]
    assert _verify(endpoint["secret"], headers, body)
    assert headers["webhook-id"].startswith("msg_")
    assert headers["webhook-timestamp"] == str(START_US // S + 16)
    payload = json.loads(body)
    assert payload["type"] == "customer.state_changed"
    [active] = payload["data"]["active_meters"]
    assert active["meter_id"] == meter["id"]
    assert (active["consumed_units"], active["balance"]) == (2, -2)
    assert active["modified_at"] == iso(START_US + 15 * S)
    tampered = body.replace(b'"consumed_units":2', b'"consumed_units":1')
    assert not _verify(endpoint["secret"], headers, tampered)
    # The SDK's own verifier and reader agree with the emulator's signature and body.
    key = secret_key(endpoint["secret"])
    assert verify(key, headers, body, now_s=START_US / S + 16).genuine
    [reading] = parse_state_changed(body)[0]
    assert (reading.external_customer_id, reading.consumed) == ("acme", 2)


def test_a_cycle_shows_in_the_webhook_as_a_subscription_period(
    pub: Emulator, client: httpx.Client, receiver: Receiver
) -> None:
    meter = pub.create_meter("calls", COUNT_ALL, {"func": "count"})
    pub.create_customer("acme")
    pub.register_webhook(receiver.url)
    pub.advance(30)
    pub.cycle(meter["id"], 10, external_customer_id="acme")
    pub.advance(6)
    wait_for(lambda: receiver.requests, "the cycle's webhook")
    data = json.loads(receiver.requests[-1][1])["data"]
    [period] = data["active_subscriptions"]
    assert period["current_period_start"] == iso(START_US + 30 * S)
    assert [(m["meter_id"], m["credited_units"]) for m in period["meters"]] == [(meter["id"], 10)]
    [reading] = parse_state_changed(receiver.requests[-1][1])[0]
    assert reading.reset_at_us == START_US + 30 * S


def test_webhook_retried_until_accepted(
    pub: Emulator, client: httpx.Client, receiver: Receiver
) -> None:
    pub.create_meter("calls", COUNT_ALL, {"func": "count"})
    pub.register_webhook(receiver.url, "whsec_" + base64.b64encode(b"k" * 24).decode())
    receiver.status = 500
    ingest_ok(client, event(ext="acme", id="1"))
    pub.advance(16)
    wait_for(lambda: len(receiver.requests) == 1, "the first attempt")
    wait_for(lambda: pub.webhooks()["deliveries"][0]["outcome"] == "pending", "a retry planned")
    receiver.status = 200
    pub.advance(5)  # the first backoff
    wait_for(lambda: pub.webhooks()["deliveries"][0]["outcome"] == "delivered", "the retry")
    first, second = receiver.requests
    assert first[0]["webhook-id"] == second[0]["webhook-id"]  # the same message, again


def test_webhook_faults_drop_and_delay(
    pub: Emulator, client: httpx.Client, receiver: Receiver
) -> None:
    meter = pub.create_meter("calls", COUNT_ALL, {"func": "count"})
    pub.register_webhook(receiver.url)
    pub.fault_webhook_drop(count=1)
    ingest_ok(client, event(ext="acme", id="1"))
    pub.advance(16)
    assert pub.webhooks()["deliveries"][0]["outcome"] == "dropped"

    pub.fault_webhook_delay(120, count=1)
    ingest_ok(client, event(ext="acme", id="2"))
    pub.advance(16)
    pub.grant_credits(meter["id"], 10, external_customer_id="acme")
    pub.advance(1)  # the credit's webhook overtakes the held one
    wait_for(lambda: len(receiver.requests) == 1, "the credit's webhook")
    pub.advance(120)
    wait_for(lambda: len(receiver.requests) == 2, "the held webhook")
    late, early = (b["data"]["active_meters"][0] for b in receiver.bodies())
    assert late["credited_units"] == 10 and early["credited_units"] == 0  # out of order


def test_quantities_windows_by_timestamp_behind_a_replica(
    pub: Emulator, client: httpx.Client
) -> None:
    meter = pub.create_meter("tokens", COUNT_ALL, {"func": "sum", "property": "n"})
    pub.set_replica_lag(5)
    ingest_ok(
        client,
        event(ext="c1", id="old", at=START_US - 3 * 3600 * S, n=100),
        event(ext="c1", id="a", at=START_US - 30 * S, n=2),
        event(ext="c2", id="other", n=50),
    )
    params = {
        "start_timestamp": iso(START_US - 3600 * S),
        "end_timestamp": iso(START_US + 3600 * S),
        "interval": "hour",
        "external_customer_id": "c1",
    }
    url = f"/v1/meters/{meter['id']}/quantities"
    assert client.get(url, params=params).json()["total"] == 0  # the replica lags
    pub.advance(5)
    body = client.get(url, params=params).json()
    assert body["total"] == 2  # "old" is before the window
    assert [q["timestamp"] for q in body["quantities"]] == [
        iso(START_US - 2 * 60 * S - 3600 * S),
        iso(START_US - 2 * 60 * S),
        iso(START_US - 2 * 60 * S + 3600 * S),
    ]
    refused = client.get(url, params={**params, "interval": "minute"})
    assert refused.status_code == 422


def test_public_options_through_the_admin_api(pub: Emulator) -> None:
    with httpx.Client(base_url=f"{pub.url}/__emulator", timeout=10) as admin:
        assert admin.post("/webhooks", json={"url": "ftp://x"}).status_code == 422
        bad_secret = {"url": "http://x", "secret": "nope"}
        assert admin.post("/webhooks", json=bad_secret).status_code == 422
        assert admin.post("/cycle", json={"meter_id": "x", "units": 1}).status_code == 404
        faults = admin.post("/faults", json={"webhook_drop": {"count": 2}, "replica_lag": 3})
        assert faults.json()["webhooks"]["drop"] == 2
        assert faults.json()["replica_lag_s"] == 3
        assert admin.post("/faults", json={"clear": True}).json()["webhooks"]["drop"] == 0
        assert admin.get("/state").json()["public"]["public_only"] is True


def test_recompute_delays_are_checked() -> None:
    with pytest.raises(ValueError, match="minimum"):
        Emulator.start(public_only=True, recompute_delays=(20, 10))


def test_cli_public_only() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, "-m", "outpost_emulator.cli", "emulator", "--port", str(port),
         "--public-only", "--recompute-delays", "1", "60", "--replica-lag", "2"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{url}/__emulator/state").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, "the CLI emulator to listen", timeout=20)
        public = httpx.get(f"{url}/__emulator/state").json()["public"]
        assert public["public_only"] is True and public["replica_lag_s"] == 2
        headers = auth("polar_oat_local")
        assert (
            httpx.post(f"{url}/v1/outpost/telemetry/v1/metrics", headers=headers).status_code == 404
        )
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=20)
    assert "public API only" in stderr
