"""`outpost demo --public-only`: the emulator serving only Polar's public API (no `/v1/outpost/`),
two instances in `mode="auto"` that find it out and follow Polar by polls and webhooks, and a
verdict on the public mode's promise: no local balance ever above what Polar reports nor above the
truth (what Polar would report if it recomputed now), and every instance reading Polar's balance,
with nothing left pending, once Polar recomputed after the traffic."""

from __future__ import annotations

import argparse
import random
import time
import uuid

import httpx

from outpost_emulator import Emulator
from outpost_sync import InvalidWebhook, Outpost
from outpost_sync.cli._webhook_endpoint import WebhookEndpoint

NAMES = ("ada", "grace", "linus", "margaret", "ken", "barbara", "dennis", "frances")
CREDITS = 5_000
RECOMPUTE = (2.0, 60.0)  # Polar's job runs this long after a customer's last ingest (15 s live)
MARGIN = 1.0  # seconds: under the recompute delay, so a recompute after a pause prunes


class _Webhooks:
    """The merchant's webhook endpoint on loopback: each delivery to one instance, in turn."""

    def __init__(self) -> None:
        self.instances: list[Outpost] = []
        self.answers: list[int] = []
        self.endpoint = WebhookEndpoint(self.take, "/polar/webhooks")
        self.url = self.endpoint.url

    def take(self, body: bytes, headers: dict[str, str]) -> int:
        if not self.instances:
            return 503  # not up yet: Polar delivers it again
        instance = self.instances[len(self.answers) % len(self.instances)]
        try:
            status = instance.handle_webhook(body, headers)
        except InvalidWebhook:
            status = 401
        except Exception:  # the demo's endpoint: Polar retries whatever went wrong
            status = 500
        self.answers.append(status)
        return status

    def close(self) -> None:
        self.endpoint.close()


class PublicDemo:
    def __init__(self, options: argparse.Namespace, redis_url: str, description: str) -> None:
        self.options = options
        self.redis_url = redis_url
        self.description = description
        run = uuid.uuid4().hex[:6]
        self.customers = [f"demo-{run}-{name}" for name in NAMES[: options.customers]]
        self.traffic_s = 3.0 if options.fast else 8.0
        self.samples = 0
        self.problems: list[str] = []

    def say(self, text: str) -> None:
        print(text, flush=True)

    def run(self) -> int:
        self.say(
            f"Outpost demo, public API only: 2 instances (mode auto), {len(self.customers)} "
            f"customers, {self.traffic_s:g} s of traffic"
        )
        self.say(f"  Redis:  {self.description}")
        hooks = _Webhooks()
        try:
            with Emulator.start(port=0, public_only=True, recompute_delays=RECOMPUTE) as emu:
                return self._run(emu, hooks)
        finally:
            hooks.close()

    def _run(self, emu: Emulator, hooks: _Webhooks) -> int:
        self.say(f"  Polar:  emulator at {emu.url}, public API only (/v1/outpost/ answers 404)")
        meter = str(
            emu.create_meter(
                "demo tokens",
                {
                    "conjunction": "and",
                    "clauses": [{"property": "name", "operator": "eq", "value": "api_call"}],
                },
                {"func": "sum", "property": "tokens"},
            )["id"]
        )
        for customer in self.customers:
            emu.grant_credits(meter, CREDITS, external_customer_id=customer)
        secret = emu.register_webhook(hooks.url)["secret"]
        self.say(f"  Webhooks: customer.state_changed to {hooks.url}")
        instances = [self._instance(emu, secret) for _ in range(2)]
        hooks.instances = instances
        http = httpx.Client(base_url=emu.url, headers={"Authorization": f"Bearer {emu.token}"})
        try:
            for name, instance in zip("AB", instances, strict=True):
                for customer in self.customers:
                    instance.balance(meter, external_customer_id=customer)
                status = instance.status
                self.say(f"  {name}: mode {status.mode} ({status.mode_reason})")
                if status.mode != "public":
                    self.problems.append(f"instance {name} runs the {status.mode} mode")
            self._traffic(emu, http, meter, instances)
            self._settle(emu, http, meter, instances)
        finally:
            http.close()
            for instance in instances:
                instance.close(timeout=5)
        return self._verdict(len(hooks.answers))

    def _instance(self, emu: Emulator, secret: str) -> Outpost:
        return Outpost(
            access_token=emu.token,
            server_url=emu.url,
            redis_url=self.redis_url,
            telemetry=False,
            linger=0.05,
            public_margin=MARGIN,
            poll_interval=2.0,
            webhook_secret=secret,
        )

    def _reported(self, http: httpx.Client, meter: str, customer: str) -> float:
        params = {"external_customer_id": customer, "meter_id": meter}
        items = http.get("/v1/customer-meters/", params=params).json()["items"]
        return float(items[0]["balance"]) if items else 0.0

    def _check(
        self, emu: Emulator, http: httpx.Client, meter: str, instances: list[Outpost]
    ) -> str:
        """Polar's figures first, then the local balances: each at or below both."""
        cells = []
        for customer in self.customers:
            polar = self._reported(http, meter, customer)
            truth = float(emu.customer_meter(meter, external_customer_id=customer)["balance"])
            local = [i.balance(meter, external_customer_id=customer).balance for i in instances]
            self.samples += 1
            for name, value in zip("AB", local, strict=True):
                if value > polar or value > truth:
                    self.problems.append(
                        f"{customer}: {name} read {value:g} above Polar's {polar:g} or the "
                        f"truth {truth:g}"
                    )
            cells.append(
                f"{customer.rsplit('-', 1)[1]} A {local[0]:g} B {local[1]:g} "
                f"Polar {polar:g} truth {truth:g}"
            )
        return "; ".join(cells)

    def _traffic(
        self, emu: Emulator, http: httpx.Client, meter: str, instances: list[Outpost]
    ) -> None:
        rng = random.Random(1)
        deadline = time.monotonic() + self.traffic_s
        next_check = time.monotonic()
        while time.monotonic() < deadline:
            instance = rng.choice(instances)
            customer = rng.choice(self.customers)
            tokens = rng.randint(1, 40)
            instance.track("api_call", external_customer_id=customer, metadata={"tokens": tokens})
            if time.monotonic() >= next_check:
                self.say(f"  serving: {self._check(emu, http, meter, instances)}")
                next_check += 1.0
            time.sleep(0.01)

    def _settle(
        self, emu: Emulator, http: httpx.Client, meter: str, instances: list[Outpost]
    ) -> None:
        for instance in instances:
            instance.flush()
        self.say("  traffic stopped; waiting for Polar's recompute and its figures")
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            line = self._check(emu, http, meter, instances)
            if all(self._settled(emu, http, meter, c, instances) for c in self.customers):
                self.say(f"  settled: {line}")
                return
            time.sleep(0.25)
        self.problems.append("the instances did not reach Polar's balance within 30 s")

    def _settled(
        self,
        emu: Emulator,
        http: httpx.Client,
        meter: str,
        customer: str,
        instances: list[Outpost],
    ) -> bool:
        polar = self._reported(http, meter, customer)
        truth = float(emu.customer_meter(meter, external_customer_id=customer)["balance"])
        reads = [i.balance(meter, external_customer_id=customer) for i in instances]
        return polar == truth and all(r.balance == polar and r.pending == 0 for r in reads)

    def _verdict(self, webhooks: int) -> int:
        if self.problems:
            self.say("VERDICT: DISAGREEMENT")
            for problem in self.problems[:10]:
                self.say(f"  - {problem}")
            return 1
        self.say(
            f"VERDICT: OK: in the public-API mode, instances A and B never read above Polar's "
            f"balance nor the truth ({self.samples} samples, {webhooks} webhook deliveries "
            "taken), and read Polar's balance with nothing pending once it recomputed"
        )
        return 0
