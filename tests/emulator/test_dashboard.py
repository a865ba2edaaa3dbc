"""The dashboard without a browser: the page and its files, and `GET /__emulator/summary`."""

from __future__ import annotations

from typing import Any

import httpx

from outpost_emulator import Emulator
from outpost_emulator._summary import CUSTOMERS_SHOWN
from tests.emulator.helpers import COUNT_ALL, START_US, Ws, event, ingest_ok, iso, wait_for

HOSTILE = '<img src=x onerror="document.title=1">'


def summary(admin: httpx.Client) -> dict[str, Any]:
    response = admin.get("/summary")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def bucket(admin: httpx.Client, start_us: int) -> dict[str, Any]:
    found = [b for b in summary(admin)["buckets"] if b["start"] == iso(start_us)]
    assert len(found) == 1, summary(admin)["buckets"]
    shown: dict[str, Any] = found[0]
    return shown


def test_the_page_and_its_files_are_served_with_a_strict_policy(emu: Emulator) -> None:
    with httpx.Client(base_url=emu.url, timeout=10) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "default-src 'none'" in policy
        assert page.headers["x-content-type-options"] == "nosniff"
        for name, media_type in [
            ("dashboard.js", "text/javascript"),
            ("dashboard.css", "text/css"),
            ("favicon.svg", "image/svg+xml"),
        ]:
            assert f"/__emulator/dashboard/{name}" in page.text
            asset = client.get(f"/__emulator/dashboard/{name}")
            assert asset.status_code == 200
            assert asset.headers["content-type"].startswith(media_type)
        # Only the shipped files: no path reaches anything else in the package.
        for path in ["index.html", "..%2F_summary.py", "_summary.py", "x.js"]:
            assert client.get(f"/__emulator/dashboard/{path}").status_code == 404


def test_the_script_writes_server_values_as_text_only(emu: Emulator) -> None:
    with httpx.Client(base_url=emu.url, timeout=10) as client:
        script = client.get("/__emulator/dashboard/dashboard.js").text
    for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("]:
        assert sink not in script


def test_summary_shows_meters_customers_and_polars_balances(
    emu: Emulator, http: httpx.Client, admin: httpx.Client
) -> None:
    assert summary(admin)["meters"] == []
    assert summary(admin)["customers"] == []
    calls = emu.create_meter(HOSTILE, COUNT_ALL, {"func": "count"})
    tokens = emu.create_meter("tokens", COUNT_ALL, {"func": "sum", "property": "tokens"})
    named = emu.create_customer("acme")
    emu.grant_credits(calls["id"], 10, external_customer_id=HOSTILE)
    ingest_ok(http, event(ext=HOSTILE, tokens=7), event(ext=HOSTILE, tokens=5), event(ext="acme"))

    shown = summary(admin)
    assert [(m["id"], m["name"]) for m in shown["meters"]] == [
        (calls["id"], HOSTILE),
        (tokens["id"], "tokens"),
    ]
    assert shown["meters"][1]["aggregation"] == {"func": "sum", "property": "tokens"}
    by_external = {c["external_id"]: c for c in shown["customers"]}
    assert set(by_external) == {HOSTILE, "acme"}
    assert by_external["acme"]["customer_id"] == named["id"]
    assert by_external[HOSTILE]["customer_id"] is None  # an external-only customer
    assert by_external[HOSTILE]["meters"] == [
        {"meter_id": calls["id"], "consumed_units": 2.0, "credited_units": 10, "balance": 8.0},
        {"meter_id": tokens["id"], "consumed_units": 12.0, "credited_units": 0, "balance": -12.0},
    ]
    # The balance is Polar's own customer meter, whatever the pipeline has synced yet.
    assert (
        by_external["acme"]["meters"][0]["balance"]
        == emu.customer_meter(calls["id"], customer_id=named["id"])["balance"]
    )
    assert shown["customers_total"] == 2


def test_summary_counts_events_ingested_per_minute_of_the_emulator_clock(
    emu: Emulator, http: httpx.Client, admin: httpx.Client
) -> None:
    ingest_ok(http, event(), event())
    emu.advance(60)
    ingest_ok(http, event())
    minutes = summary(admin)["ingest_per_minute"]
    assert len(minutes) == 15
    assert minutes[-1] == {"minute": iso(START_US + 60_000_000), "events": 1}
    assert minutes[-2] == {"minute": iso(START_US), "events": 2}
    assert sum(m["events"] for m in minutes) == 3
    emu.advance(15 * 60)  # those minutes leave the window
    assert sum(m["events"] for m in summary(admin)["ingest_per_minute"]) == 0


def test_a_bucket_goes_from_open_to_closed_synced_and_sealed_on_the_clock(
    emu: Emulator, http: httpx.Client, admin: httpx.Client
) -> None:
    emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    start = START_US - 2 * 60_000_000  # 15:00, the current bucket at 15:02
    ingest_ok(http, event(id="e1"), event(id="e2"))
    first = bucket(admin, start)
    assert first["state"] == "open"
    assert (first["events"], first["in_redis"], first["counted"]) == (2, 2, 0)
    assert first["sync_at"] == iso(start + 310_000_000)  # 10 s after its end
    assert first["seal_at"] == iso(start + 960_000_000)  # 11 minutes after its end

    emu.advance(3 * 60 + 5)  # 15:05:05, closed, its close-sync at 15:05:10
    assert bucket(admin, start)["state"] == "closed"
    emu.advance(5)
    synced = bucket(admin, start)
    assert synced["state"] == "synced"
    assert (synced["in_redis"], synced["counted"], synced["generations"]) == (0, 2, 1)
    assert summary(admin)["counters"]["close_syncs_run"] == 1
    emu.advance(11 * 60)  # 15:16:10
    assert bucket(admin, start)["state"] == "sealed"
    # A late event after the seal opens the bucket's second generation.
    ingest_ok(http, event(id="late", at=start + 60_000_000))
    assert bucket(admin, start)["generations"] == 2
    # The current bucket is always shown, even empty.
    newest = summary(admin)["buckets"][0]
    assert (newest["state"], newest["events"]) == ("open", 0)


def test_a_paused_sync_keeps_a_bucket_closed(
    emu: Emulator, http: httpx.Client, admin: httpx.Client
) -> None:
    start = START_US - 2 * 60_000_000
    ingest_ok(http, event())
    emu.fault_pause_syncs()
    emu.advance(4 * 60)
    assert bucket(admin, start)["state"] == "closed"
    assert summary(admin)["faults"]["syncs_paused"] is True
    emu.fault_clear()
    assert bucket(admin, start)["state"] == "synced"


def test_summary_lists_connections_and_their_subscriptions(
    emu: Emulator, admin: httpx.Client
) -> None:
    assert summary(admin)["connections"] == []
    with Ws(emu) as ws:
        ws.snapshot(external_customer_id=HOSTILE)
        [connection] = summary(admin)["connections"]
        assert connection["subscriptions"] == [{"external_customer_id": HOSTILE}]
        assert connection["frames_in"] == 1
        assert connection["frames_out"] == 1
    # Gone once the server has read the close frame.
    wait_for(lambda: not summary(admin)["connections"], "the closed connection to leave")


def test_summary_lists_the_faults_in_force_until_cleared(
    emu: Emulator, admin: httpx.Client
) -> None:
    emu.fault_ingest_error(503, count=2)
    emu.fault_ingest_hang(3)
    emu.fault_snapshot_delay(2)
    faults = summary(admin)["faults"]
    assert [f["kind"] for f in faults["ingest"]] == ["error", "hang"]
    assert faults["ingest"][0]["status"] == 503
    assert faults["ingest"][0]["remaining"] == 2
    assert faults["snapshot_delay_s"] == 2
    emu.fault_clear()
    assert summary(admin)["faults"] == {
        "ingest": [],
        "snapshot_delay_s": 0.0,
        "syncs_paused": False,
    }


def test_summary_shows_the_most_recently_active_customers_only(
    emu: Emulator, http: httpx.Client, admin: httpx.Client
) -> None:
    emu.create_meter("calls", COUNT_ALL, {"func": "count"})
    ingest_ok(http, *[event(ext=f"c{n}") for n in range(CUSTOMERS_SHOWN + 5)])
    emu.advance(1)
    ingest_ok(http, event(ext="c0"))  # the oldest becomes the newest
    shown = summary(admin)
    assert shown["customers_total"] == CUSTOMERS_SHOWN + 5
    names = [c["external_id"] for c in shown["customers"]]
    # The newest: c0 again, then those that came last (c54 down to c6); listed by name.
    assert names == sorted(["c0", *[f"c{n}" for n in range(6, CUSTOMERS_SHOWN + 5)]])
    assert shown["customers"][0]["last_active"] == iso(START_US + 1_000_000)


def test_summary_refuses_writes(admin: httpx.Client) -> None:
    refused = admin.post("/summary", json={})
    assert refused.status_code == 405
    assert refused.json() == {"detail": "Method Not Allowed"}
