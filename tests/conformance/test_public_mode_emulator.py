"""The core's public-mode ledger fed by the emulator's public API over real HTTP: signed webhooks
(some dropped, some late), polls of the customer meters, cycles; the local balance never reads
above what Polar reported, nor above the true balance the emulator's admin API tells (less a
credit decrease not reported yet)."""

from __future__ import annotations

import random

import httpx
import pytest

from outpost_core._public_book import PublicBook
from outpost_core._public_ledger import MeterLedger
from outpost_core._public_polls import PollPlanner
from outpost_core._public_readings import parse_customer_meters, parse_state_changed
from outpost_core._webhook_signature import secret_key, verify
from outpost_emulator import Emulator, EmulatorClock
from tests.emulator.helpers import COUNT_ALL, START, auth, iso, wait_for
from tests.support.webhook_receiver import Receiver

S = 1_000_000


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_ledger_against_the_emulator(receiver: Receiver, seed: int) -> None:
    rng = random.Random(seed)
    clock = EmulatorClock(START, frozen=True)
    with (
        Emulator.start(clock=clock, public_only=True) as emu,
        httpx.Client(base_url=emu.url, headers=auth(emu.token), timeout=10) as http,
    ):
        meter = emu.create_meter("calls", COUNT_ALL, {"func": "count"})["id"]
        customer = emu.create_customer("acme")["id"]
        key = secret_key(emu.register_webhook(receiver.url)["secret"])
        emu.grant_credits(meter, 500, customer_id=customer)
        book = MeterLedger("count", margin_us=60 * S)
        seen = 0
        sent = 0
        outcomes: list[str] = []

        def settle() -> None:
            wait_for(
                lambda: all(d["outcome"] != "sending" for d in emu.webhooks()["deliveries"]),
                "deliveries in flight",
            )

        def take_webhooks() -> None:
            nonlocal seen
            for headers, body in list(receiver.requests)[seen:]:
                seen += 1
                assert verify(key, headers, body, clock.time()).genuine
                readings, rejected = parse_state_changed(body)
                assert rejected == []
                for reading in readings:
                    outcomes.append(book.observe(reading).value)

        for _ in range(40):
            step = rng.random()
            if step < 0.45:
                batch = [f"e{sent + i}" for i in range(rng.randint(1, 5))]
                sent += len(batch)
                for event_id in batch:
                    book.record(event_id)
                events = [
                    {"name": "call", "external_customer_id": "acme", "external_id": e}
                    for e in batch
                ]
                response = http.post("/v1/events/ingest", json={"events": events})
                assert response.status_code == 200
                book.acknowledged(batch, clock.now_us())
            elif step < 0.75:
                emu.advance(rng.choice([1, 5, 16, 30, 90, 400]))
            elif step < 0.82:
                emu.fault_webhook_drop(count=1)
            elif step < 0.88:
                emu.fault_webhook_delay(rng.choice([30, 200]), count=1)
            elif step < 0.93:
                emu.cycle(meter, rng.randint(100, 500), customer_id=customer)
            else:
                page = http.get(
                    "/v1/customer-meters/", params={"external_customer_id": "acme", "limit": 100}
                )
                for reading in parse_customer_meters(page.content)[0]:
                    outcomes.append(book.observe(reading).value)
            settle()
            take_webhooks()
            local = book.balance()
            if local.balance is None:
                continue
            assert book.anchor is not None
            assert local.balance <= book.anchor.balance
            truth = emu.customer_meter(meter, customer_id=customer)
            # A cycle that grants less than what remained lowers the credits: until its figure
            # arrives, that is a credit decrease the promise excludes.
            unseen = max(0, book.anchor.credited - truth["credited_units"])
            assert local.balance <= truth["balance"] + unseen
        assert "accepted" in outcomes or "first" in outcomes


def test_the_plan_runs_against_the_public_api() -> None:
    """What the planner asks for is what Polar's API serves: polls of up to 100 rows and
    quantities probes, answered and read back into the ledgers."""
    clock = EmulatorClock(START, frozen=True)
    with (
        Emulator.start(clock=clock, public_only=True) as emu,
        httpx.Client(base_url=emu.url, headers=auth(emu.token), timeout=10) as http,
    ):
        meters = [
            emu.create_meter(f"meter{n}", COUNT_ALL, {"func": "count"})["id"] for n in range(3)
        ]
        customers = [f"c{n}" for n in range(60)]
        for customer in customers:
            emu.create_customer(customer)
        emu.advance(20)  # the creation jobs made the rows
        book = PublicBook(PollPlanner(per_minute=600, probe_band=0))
        for customer in customers:
            for meter in meters:
                book.follow(customer, meter, "count", clock.now_us())
        plan = book.plan(clock.now_us())
        assert len(plan.polls) == 2  # 60 customers x 3 meters: 33 customers a request, 99 rows
        seen = set()
        for request in plan.polls:
            page = http.get("/v1/customer-meters/", params=request.params())
            assert page.status_code == 200
            for customer, meter, _ in book.handle_page(page.content, clock.now_us()):
                seen.add((customer, meter))
        assert len(seen) == 180
        # c0 used its whole (zero) balance: the next plan probes it.
        http.post(
            "/v1/events/ingest",
            json={"events": [{"name": "x", "external_customer_id": "c0", "external_id": "p1"}]},
        )
        book.record("c0", meters[0], "p1")
        book.acknowledged(["p1"], clock.now_us())
        emu.advance(1)
        probes = book.plan(clock.now_us()).probes
        assert {(p.customer, p.meter_id) for p in probes} >= {("c0", meters[0])}
        probe = next(p for p in probes if p.customer == "c0")
        sent = clock.now_us()
        answer = http.get(
            f"/v1/meters/{probe.meter_id}/quantities",
            params={
                "external_customer_id": probe.customer,
                "start_timestamp": iso(probe.start_us),
                "end_timestamp": iso(probe.end_us),
                "interval": probe.interval,
            },
        )
        assert answer.status_code == 200, answer.text
        total = answer.json()["total"]
        assert total == 1
        assert book.handle_probe("c0", meters[0], total, sent, 0)
        assert book.balance("c0", meters[0]).balance == -1
