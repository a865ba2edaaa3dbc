"""The public-API mode, both drivers, against real Redis and the emulator serving only Polar's
public API: the mode chosen on a 404, anchors from polls and webhooks (late, lost), the promise
(never above what Polar reports nor above the truth; equal to Polar's once it recomputes), a
billing cycle, admission, bad webhooks, and a track racing an anchor's compare-and-set."""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from outpost_async import (
    AsyncOutpost,
    ConfigurationError,
    InsufficientBalance,
    InvalidWebhook,
    NotReady,
    RedisUnavailable,
)
from outpost_core import CONFIGURATION_KEY, keys
from outpost_core._webhook_signature import secret_key, sign
from outpost_emulator import Emulator
from tests.drivers._async._helpers import CALLS_FILTER, connect, eventually, holds
from tests.support.redis_server import RedisServer
from tests.support.webhook_receiver import Receiver

MARGIN = 0.3  # seconds: Polar recomputes a second after the last ingest, well after it
POLL = 0.5


def public(server: RedisServer, emulator: Emulator, **options: Any) -> AsyncOutpost:
    options.setdefault("public_margin", MARGIN)
    options.setdefault("poll_interval", POLL)
    return connect(server, emulator, **options)


@asynccontextmanager
async def running(
    server: RedisServer, emulator: Emulator, credits: int, **options: Any
) -> AsyncIterator[tuple[str, AsyncOutpost]]:
    """A counting meter granting ``credits`` to c1, then one instance started on it."""
    meter = calls_meter(emulator, credits)
    async with public(server, emulator, **options) as instance:
        yield meter, instance


@asynccontextmanager
async def running_pair(
    server: RedisServer, emulator: Emulator, credits: int
) -> AsyncIterator[tuple[str, AsyncOutpost, AsyncOutpost]]:
    """As ``running``, with two instances sharing the Redis."""
    meter = calls_meter(emulator, credits)
    async with public(server, emulator) as a, public(server, emulator) as b:
        yield meter, a, b


def by_webhook(
    emulator: Emulator, receiver: Receiver, poll_interval: float = 60.0
) -> dict[str, Any]:
    """Options of an instance that takes the webhooks Polar sends ``receiver`` (registered here)
    and polls ``poll_interval`` apart: a minute, so that the figures come by webhook."""
    secret = emulator.register_webhook(receiver.url)["secret"]
    return {"webhook_secret": secret, "poll_interval": poll_interval}


def calls_meter(emulator: Emulator, credits: int, customer: str = "c1") -> str:
    meter = str(emulator.create_meter("calls", CALLS_FILTER, {"func": "count"})["id"])
    emulator.create_customer(customer)
    emulator.grant_credits(meter, credits, external_customer_id=customer)
    return meter


def reported(emulator: Emulator, meter: str, customer: str = "c1") -> float:
    """The balance Polar's public API reports now (the row, recomputed late)."""
    response = httpx.get(
        f"{emulator.url}/v1/customer-meters/",
        params={"external_customer_id": customer, "meter_id": meter},
        headers={"Authorization": f"Bearer {emulator.token}"},
    )
    items = response.json()["items"]
    return float(items[0]["balance"]) if items else 0.0


def truth(emulator: Emulator, meter: str, customer: str = "c1") -> float:
    """What Polar would report if it recomputed now."""
    return float(emulator.customer_meter(meter, external_customer_id=customer)["balance"])


async def balance(instance: AsyncOutpost, meter: str, customer: str = "c1") -> float:
    return (await instance.balance(meter, external_customer_id=customer)).balance


async def settled(instance: AsyncOutpost, meter: str, polar: float) -> bool:
    """The instance reads Polar's balance from Polar's figure alone: nothing left pending."""
    read = await instance.balance(meter, external_customer_id="c1")
    return read.balance == polar and read.pending == 0


async def check_promise(emulator: Emulator, meter: str, *instances: AsyncOutpost) -> None:
    """Polar's figures first, then the local balances: each local one at or below both."""
    polar, true = reported(emulator, meter), truth(emulator, meter)
    for instance in instances:
        local = await balance(instance, meter)
        assert local <= polar, (local, polar)
        assert local <= true, (local, true)


async def converge(
    emulator: Emulator,
    meter: str,
    *instances: AsyncOutpost,
    each_look: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Traffic stopped: once Polar recomputed, every instance reads Polar's balance
    (``each_look`` runs before each look: handing the instances the webhooks come meanwhile)."""
    for instance in instances:
        assert await instance.flush()

    async def equal() -> bool:
        if each_look is not None:
            await each_look()
        polar, true = reported(emulator, meter), truth(emulator, meter)
        readings = [await settled(instance, meter, polar) for instance in instances]
        return polar == true and all(readings)

    await eventually(equal, timeout=20.0, what="every instance reading Polar's balance")


async def pump(receiver: Receiver, taken: list[int], *instances: AsyncOutpost) -> None:
    """Hand the deliveries that arrived to the instances, in turn (each its endpoint)."""
    requests = list(receiver.requests)
    for index in range(taken[0], len(requests)):
        headers, body = requests[index]
        instance = instances[index % len(instances)]
        assert await instance.handle_webhook(body, headers) == 204
    taken[0] = len(requests)


@pytest.mark.anyio
async def test_auto_selects_the_public_mode_on_a_404(
    redis_server: RedisServer, public_emulator: Emulator
) -> None:
    async with running(redis_server, public_emulator, 100) as (meter, instance):
        first = await instance.balance(meter, external_customer_id="c1")
        assert (first.credited, first.balance, first.snapshot_id) == (100, 100, "public")
        status = instance.status
        assert status.mode == "public" and "404" in status.mode_reason
        assert status.websocket == "none"
        await instance.track("api_call", external_customer_id="c1")
        assert await balance(instance, meter) == 99  # at once, before Polar knows
        cached = json.loads(redis_server.client().get(CONFIGURATION_KEY) or "{}")
        assert cached["mode"] == "public"
        assert [r["id"] for r in cached["reducers"]] == [meter]


@pytest.mark.anyio
async def test_a_customer_polar_has_no_row_for_reads_nothing_credited(
    redis_server: RedisServer, public_emulator: Emulator
) -> None:
    async with running(redis_server, public_emulator, 5, mode="public") as (meter, instance):
        unknown = await instance.balance(meter, external_customer_id="nobody")
        assert (unknown.credited, unknown.balance) == (0, 0)


@pytest.mark.anyio
async def test_a_mode_that_differs_from_the_cached_one_is_refused(
    redis_server: RedisServer, public_emulator: Emulator
) -> None:
    async with running(redis_server, public_emulator, 5) as (meter, instance):
        await instance.balance(meter, external_customer_id="c1")
    other = public(redis_server, public_emulator, mode="snapshots")
    with pytest.raises(ConfigurationError, match="public mode"):
        await other.balance(meter, external_customer_id="c1")
    await other.close()


@pytest.mark.anyio
async def test_a_start_refused_for_a_conflicting_mode_is_tried_again_by_the_next_call(
    redis_server: RedisServer, public_emulator: Emulator
) -> None:
    meter = calls_meter(public_emulator, 2)
    redis_server.client().set(CONFIGURATION_KEY, "{}")  # as a snapshots-mode instance caches it
    instance = public(redis_server, public_emulator, mode="public")
    try:
        with pytest.raises(ConfigurationError, match="snapshots mode"):
            await instance.balance(meter, external_customer_id="c1")
        redis_server.client().delete(CONFIGURATION_KEY)  # that mode's instances gone, Redis wiped
        assert (await instance.balance(meter, external_customer_id="c1")).credited == 2
    finally:
        await instance.close()


@pytest.mark.anyio
async def test_two_instances_tracking_stay_at_or_below_polar_then_equal_it(
    redis_server: RedisServer, public_emulator: Emulator
) -> None:
    async with running_pair(redis_server, public_emulator, 1_000) as (meter, a, b):
        for round_ in range(30):
            for instance in (a, b):
                await instance.track("api_call", external_customer_id="c1")
            if round_ % 3 == 0:
                await check_promise(public_emulator, meter, a, b)
        await converge(public_emulator, meter, a, b)
        assert await balance(a, meter) == 1_000 - 60
        assert a.rejections.get("public", 0) == 0


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["none", "late", "lost"])
async def test_webhooks_on_late_or_lost(
    redis_server: RedisServer, public_emulator: Emulator, receiver: Receiver, fault: str
) -> None:
    meter = calls_meter(public_emulator, 500)
    # Polls are rare: the figures come by webhook (or, when lost, by the next poll).
    options = by_webhook(public_emulator, receiver, 3.0 if fault == "lost" else 60.0)
    if fault == "late":
        public_emulator.fault_webhook_delay(3.0, count=2)
    elif fault == "lost":
        public_emulator.fault_webhook_drop(count=2)
    a = public(redis_server, public_emulator, **options)
    b = public(redis_server, public_emulator, **options)
    taken = [0]
    async with a, b:
        for round_ in range(20):
            await a.track("api_call", external_customer_id="c1")
            await b.track("api_call", external_customer_id="c1")
            await pump(receiver, taken, a, b)
            if round_ % 4 == 0:
                await check_promise(public_emulator, meter, a, b)

        async def pumped() -> None:
            await pump(receiver, taken, a, b)

        await converge(public_emulator, meter, a, b, each_look=pumped)
        assert await balance(a, meter) == 500 - 40
        if fault != "lost":
            assert taken[0] > 0  # the webhooks brought the figures (polls are a minute apart)
        applied = a._public.anchors.outcomes + b._public.anchors.outcomes
        assert applied["accepted"] + applied["first"] > 0


@pytest.mark.anyio
async def test_a_cycle_reads_the_new_credits_less_the_usage_after_it(
    redis_server: RedisServer, public_emulator: Emulator
) -> None:
    async with running(redis_server, public_emulator, 100) as (meter, instance):
        for _ in range(10):
            await instance.track("api_call", external_customer_id="c1")
        await converge(public_emulator, meter, instance)
        assert await balance(instance, meter) == 90
        public_emulator.cycle(meter, 50, external_customer_id="c1")

        async def new_window() -> bool:
            read = await instance.balance(meter, external_customer_id="c1")
            return read.credited == 50

        # A cycle granting less than what remained lowers the truth before any figure says so
        # (the promise excludes a credit decrease not seen yet): from its figure on, it holds.
        await eventually(new_window, what="the cycle's figure")
        await check_promise(public_emulator, meter, instance)
        for _ in range(4):
            await instance.track("api_call", external_customer_id="c1")
            await check_promise(public_emulator, meter, instance)
        assert await instance.flush()

        async def settled() -> bool:
            local = await balance(instance, meter)
            assert local <= truth(public_emulator, meter)
            return local == 46 == truth(public_emulator, meter)

        await eventually(settled, timeout=20.0, what="the new window's balance")


@pytest.mark.anyio
async def test_admission_in_the_public_mode(
    redis_server: RedisServer, public_emulator: Emulator
) -> None:
    async with running(redis_server, public_emulator, 3) as (meter, instance):
        async with await instance.reserve(meter, 2, external_customer_id="c1"):
            seen = await instance.balance(meter, external_customer_id="c1")
            assert (seen.balance, seen.held) == (3, 2)
            with pytest.raises(InsufficientBalance):
                await instance.reserve(meter, 2, external_customer_id="c1")
        for _ in range(3):
            await instance.track("api_call", external_customer_id="c1", require_balance=True)
        with pytest.raises(InsufficientBalance):
            await instance.track("api_call", external_customer_id="c1", require_balance=True)
        await converge(public_emulator, meter, instance)
        assert await balance(instance, meter) == 0


@pytest.mark.anyio
async def test_a_webhook_with_a_bad_signature_is_refused_and_a_delivery_taken_once(
    redis_server: RedisServer, public_emulator: Emulator, receiver: Receiver
) -> None:
    meter = calls_meter(public_emulator, 10)
    options = by_webhook(public_emulator, receiver)
    a = public(redis_server, public_emulator, **options)
    b = public(redis_server, public_emulator, **options)
    async with a, b:
        await balance(a, meter)
        public_emulator.grant_credits(meter, 5, external_customer_id="c1")

        async def delivered() -> bool:
            return len(receiver.requests) > 0

        await eventually(delivered, what="a webhook delivery")
        headers, body = receiver.requests[0]
        forged = {**headers, "webhook-signature": "v1,AAAA"}
        with pytest.raises(InvalidWebhook, match="no signature matches"):
            await a.handle_webhook(body, forged)
        assert a.rejections["webhook"] == 1
        assert await a.handle_webhook(body, headers) == 204
        assert await balance(a, meter) == 15
        applied = dict(a._public.anchors.outcomes)
        assert await b.handle_webhook(body, headers) == 204  # the fleet took it already
        assert dict(b._public.anchors.outcomes) == {}
        assert dict(a._public.anchors.outcomes) == applied
        await eventually(
            lambda: _reads(b, meter, 15), what="the other instance following the anchor"
        )


async def _reads(instance: AsyncOutpost, meter: str, expected: float) -> bool:
    return await balance(instance, meter) == expected


@pytest.mark.anyio
async def test_a_track_during_an_anchor_conflicts_and_loses_nothing(
    redis_server: RedisServer, public_emulator: Emulator
) -> None:
    async with running_pair(redis_server, public_emulator, 100) as (meter, a, b):
        await balance(a, meter)
        anchors = a._public.anchors
        read = anchors._read
        raced: list[str] = []

        async def racing(state: str) -> tuple[dict[str, str], dict[str, str]]:
            found = await read(state)
            # Between the read and the script, another instance tracks: at every read until one
            # conflicts (a poll's read that finds nothing new to write races without conflict).
            if not anchors.retries:
                raced.append(await b.track("api_call", external_customer_id="c1"))
            return found

        anchors._read = racing  # type: ignore[method-assign]
        public_emulator.grant_credits(meter, 10, external_customer_id="c1")
        await eventually(
            lambda: _reads(a, meter, 110 - len(raced)), what="the grant applied after a retry"
        )
        assert raced and anchors.retries >= 1 and anchors.outcomes["conflicts"] == 0
        await converge(public_emulator, meter, a, b)
        assert await balance(a, meter) == 110 - len(raced)


@pytest.mark.anyio
async def test_a_first_read_polar_does_not_answer_says_why(
    redis_server: RedisServer, public_emulator: Emulator
) -> None:
    meter = calls_meter(public_emulator, 5)
    token = "polar_oat_meters_only"
    public_emulator.add_token(token, ["meters:read", "events:write"])
    async with connect(
        redis_server, public_emulator, access_token=token, snapshot_timeout=1.0, mode="public"
    ) as instance:
        with pytest.raises(NotReady, match=r"customer meters of c1 not read yet.*HTTP 40[13]"):
            await instance.balance(meter, external_customer_id="c1")


@pytest.mark.anyio
async def test_the_snapshot_protocol_takes_webhooks_and_applies_nothing(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    secret = "whsec_" + base64.b64encode(b"a secret of the test").decode()
    async with running(redis_server, emulator, 10, webhook_secret=secret) as (meter, instance):
        before = await instance.balance(meter, external_customer_id="c1")
        assert instance.status.mode == "snapshots" and before.snapshot_id != "public"
        row = {"meter_id": meter, "consumed_units": 0, "credited_units": 999, "balance": 999}
        row["modified_at"] = "2030-01-01T00:00:00Z"
        state = {"id": str(uuid.uuid4()), "external_id": "c1", "active_meters": [row]}
        body = json.dumps({"type": "customer.state_changed", "data": state}).encode()
        stamp = int(time.time())
        headers = {
            "webhook-id": "msg_1",
            "webhook-timestamp": str(stamp),
            "webhook-signature": sign(secret_key(secret), "msg_1", stamp, body),
        }
        assert await instance.handle_webhook(body, headers) == 204
        after = await instance.balance(meter, external_customer_id="c1", fresh=True)
        assert (after.credited, after.revision) == (10, before.revision)


@pytest.mark.anyio
async def test_an_unreadable_ledger_in_redis_is_counted_and_the_loop_goes_on(
    redis_server: RedisServer, public_emulator: Emulator
) -> None:
    async with running(redis_server, public_emulator, 10) as (meter, instance):
        first = await instance.balance(meter, external_customer_id="c1")
        state = keys.state_key(first.customer, meter)
        redis_server.client().hset(state, "pub", '{"v": 1, "a": [1, "x"')  # a peer's garbage
        public_emulator.grant_credits(meter, 5, external_customer_id="c1")
        await eventually(lambda: _reads(instance, meter, 15), what="the grant applied")
        assert instance.rejections["public"] >= 1
        assert instance.status.failed_loop is None


@pytest.mark.anyio
async def test_redis_down_the_poll_loop_says_so_once_and_goes_on(
    durable_redis_server: RedisServer, public_emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    server = durable_redis_server
    meter = calls_meter(public_emulator, 2, customer="before")
    async with public(server, public_emulator) as instance:
        assert (await instance.balance(meter, external_customer_id="before")).credited == 2
        with caplog.at_level(logging.WARNING, logger="outpost"):
            server.stop()

            def said() -> list[str]:
                return [r.getMessage() for r in caplog.records if "poll loop" in r.getMessage()]

            met = holds(lambda: any("Redis failed (retried)" in line for line in said()))
            await eventually(met, timeout=20, what="the poll loop meeting the outage")
            assert not any("Polar" in line for line in said()), said()
            assert instance.status.failed_loop is None  # an outage, not a bug of the loop
            server.start()
        public_emulator.grant_credits(meter, 4, external_customer_id="after")

        async def anchored() -> bool:
            try:
                found = await instance.balance(meter, external_customer_id="after")
            except (NotReady, RedisUnavailable):
                return False
            return found.credited == 4

        await eventually(anchored, timeout=30, what="a first read anchored after the outage")
