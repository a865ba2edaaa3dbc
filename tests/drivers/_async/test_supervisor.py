"""No background loop dies for good: a loop that fails of an unexpected exception is logged,
shown in ``status``, told to the session (its copies fall back to Redis) and started again; and
an instance whose start failed starts again cleanly on the next call."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

import pytest

from outpost_async import AsyncOutpost
from outpost_async._supervisor import redacted
from outpost_core import (
    BytesReceived,
    ChangePublished,
    ChannelSubscribed,
    Input,
    SubscriptionConfirmed,
)
from outpost_emulator import Emulator
from tests.drivers._async._helpers import connect, count_meter, eventually, holds, metered
from tests.support.redis_server import RedisServer


class Breakable:
    """Makes the instance's session raise (as a bug in it would) on the inputs ``breaks``
    accepts, while ``broken``: the driver's reaction is what is tested, not the core."""

    def __init__(self, instance: AsyncOutpost, breaks: Callable[[Input], bool]) -> None:
        self.broken = True
        session = instance._context.session
        handle = session.handle

        def maybe_raise(event: Input) -> None:
            if self.broken and breaks(event):
                raise RuntimeError("injected: the session mishandled an input")
            handle(event)

        session.handle = maybe_raise  # type: ignore[method-assign]


def _subscriber_news(event: Input) -> bool:
    return isinstance(event, ChangePublished | SubscriptionConfirmed | ChannelSubscribed)


@pytest.mark.anyio
async def test_a_subscriber_that_dies_restarts_and_reads_fall_back_to_redis_meanwhile(
    redis_or_cluster: RedisServer, emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """On a cluster, each node's reader dies; the topology loop starts it again."""
    server = redis_or_cluster
    async with metered(server, emulator, credits=100) as (meter, a), connect(server, emulator) as b:
        assert (await a.balance(meter, external_customer_id="c1")).source == "memory"
        with caplog.at_level(logging.INFO, logger="outpost"):
            breakable = Breakable(a, _subscriber_news)
            await b.track("api_call", external_customer_id="c1")  # a's subscriber dies of it
            await eventually(holds(lambda: not a.subscribed), what="a's copies unsubscribed")
            # (On a cluster the copies stop answering as the node's reader goes, a moment before
            # the supervisor has recorded the failure.)
            await eventually(
                holds(lambda: a.status.failed_loop is not None), what="the failure in status"
            )
            failed = a.status.failed_loop
            assert failed is not None and "outpost-subscriber" in failed, a.status
            assert "RuntimeError" in failed
            # Meanwhile a reads Redis, and sees b's event. (On a cluster another node's reader
            # may have died first, of a confirmation: the one carrying c1's channel then dies
            # of b's change a moment later.)

            async def from_redis() -> bool:
                found = await a.balance(meter, external_customer_id="c1")
                return (found.source, found.consumed) == ("redis", 1)

            await eventually(from_redis, what="a's read of c1 from Redis, with b's event")
            breakable.broken = False
            await b.track("api_call", external_customer_id="c1")

            async def warm_and_right() -> bool:
                found = await a.balance(meter, external_customer_id="c1")
                return found.source == "memory" and found.consumed == 2

            await eventually(warm_and_right, timeout=20, what="a's subscriber back and warm")
        tracebacks = [
            r.getMessage().split(" failed,")[0]  # "outpost: the loop <name>"
            for r in caplog.records
            if r.levelno >= logging.ERROR and "Traceback" in r.getMessage()
        ]
        # Each failed loop's traceback once, then quiet (on a cluster each node's reader is a
        # loop of its own, and more than one node may carry a's channels).
        assert tracebacks, "no failure logged"
        assert len(tracebacks) == len(set(tracebacks)), tracebacks
        await b.track("api_call", external_customer_id="c1")

        async def follows() -> bool:
            found = await a.balance(meter, external_customer_id="c1")
            return found.source == "memory" and found.consumed == 3

        await eventually(follows, what="a follows b's changes again")


@pytest.mark.anyio
async def test_a_websocket_loop_that_dies_restarts_and_status_says_so(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    async with metered(redis_server, emulator, credits=100, warm=True) as (meter, a):
        await eventually(holds(lambda: a.connected), what="the WebSocket open")
        breakable = Breakable(a, lambda event: isinstance(event, BytesReceived))
        emulator.fault_send_frames(["not json"])  # any frame reaches the session: it raises
        await eventually(holds(lambda: not a.connected), what="the dead link loop noticed")
        status = a.status
        assert status.websocket != "open", status
        assert status.failed_loop is not None and "outpost-websocket" in status.failed_loop
        breakable.broken = False
        await eventually(holds(lambda: a.connected), timeout=20, what="the WebSocket again")
        emulator.grant_credits(meter, 5, external_customer_id="c2")
        # A first read after the restart is answered (it needs the link: a snapshot).
        assert (await a.balance(meter, external_customer_id="c2")).credited == 5


@pytest.mark.anyio
async def test_a_start_that_fails_starts_again_on_the_next_call(
    redis_server: RedisServer, emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("socksio") is not None:
        pytest.skip("socksio is installed: a SOCKS proxy does not fail the start")
    meter = count_meter(emulator, credits=100)
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:9")
    a = connect(redis_server, emulator)
    try:
        for _ in range(2):  # each call says why, none runs half-started
            with pytest.raises(ImportError, match="socksio"):
                await a.track("api_call", external_customer_id="c1")
        monkeypatch.delenv("ALL_PROXY")
        await a.track("api_call", external_customer_id="c1")
        assert await a.flush(30)
        assert emulator.customer_meter(meter, external_customer_id="c1")["consumed_units"] == 1
        assert a.status.failed_loop is None
    finally:
        await a.close()


def test_a_failed_loop_s_error_is_shown_without_secrets() -> None:
    error = "cannot reach redis://user:hunter2@db:6379 nor http://me:pw@proxy:3128 with tok_123"
    shown = redacted(error, "tok_123")
    assert "hunter2" not in shown and "pw@" not in shown and "tok_123" not in shown
    assert "redis://***@db:6379" in shown
