"""A wrong token or server URL on a fresh Redis names its cause: in the NotReady
message, in ``status``, and for a refused token in one ERROR line."""

from __future__ import annotations

import contextlib
import logging

import pytest

from outpost_async import AsyncOutpost, ConfigurationError, NotReady, OutpostError
from outpost_emulator import Emulator
from tests.drivers._async._helpers import connect, count_meter, eventually, holds, metered
from tests.support.redis_server import RedisServer, free_port


def instance(server: RedisServer, url: str, token: str) -> AsyncOutpost:
    return AsyncOutpost(
        access_token=token,
        server_url=url,
        redis_url=server.url,
        snapshot_timeout=1.0,
        telemetry=False,
    )


@pytest.mark.anyio
async def test_a_refused_token_is_named_in_not_ready_status_and_one_error(
    redis_server: RedisServer, emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    meter = count_meter(emulator)
    with caplog.at_level(logging.DEBUG, logger="outpost"):
        async with instance(redis_server, emulator.url, "polar_oat_wrong") as a:
            with pytest.raises(NotReady, match=r"no configuration from Polar yet.*HTTP 401"):
                await a.balance(meter, external_customer_id="c1")
            with pytest.raises(NotReady, match=r"HTTP 401"):
                await a.track("api_call", external_customer_id="c1")
            status = a.status
            assert status.websocket == "disconnected"
            assert status.websocket_error is not None and "HTTP 401" in status.websocket_error
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "HTTP 401" in errors[0], errors
    assert errors[0].count("refused") == 1, errors  # one sentence, not the cause twice over


@pytest.mark.anyio
async def test_a_server_url_where_nothing_listens_is_named(redis_server: RedisServer) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with instance(redis_server, url, "polar_oat_x") as a:
        with pytest.raises(NotReady, match=r"no configuration from Polar yet.*cannot connect"):
            await a.balance("m", external_customer_id="c1")
        error = a.status.websocket_error
        assert error is not None and "refused" in error.lower()


@pytest.mark.anyio
async def test_a_server_name_that_does_not_resolve_is_named(redis_server: RedisServer) -> None:
    async with instance(redis_server, "http://outpost-test.invalid", "polar_oat_x") as a:
        with pytest.raises(NotReady, match=r"no configuration from Polar yet.*cannot connect"):
            await a.balance("m", external_customer_id="c1")
        assert a.status.websocket_error is not None


@pytest.mark.anyio
async def test_a_first_read_with_redis_down_names_the_refused_connection(
    emulator: Emulator,
) -> None:
    meter = count_meter(emulator, credits=3)
    async with AsyncOutpost(
        access_token=emulator.token,
        server_url=emulator.url,
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        snapshot_timeout=1.0,
        telemetry=False,
    ) as a:
        unreachable = r"from Redis after 1.0 s \(Redis unreachable: .*(refused|Error 111)"
        with pytest.raises(NotReady, match=unreachable):
            await a.balance(meter, external_customer_id="c1")


def test_a_redis_url_of_an_unknown_scheme_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"redis_url: .*redis://") as raised:
        AsyncOutpost(redis_url="http://127.0.0.1:6379/0", telemetry=False)
    assert isinstance(raised.value, OutpostError)


@pytest.mark.anyio
async def test_polar_unreachable_mid_run_is_one_warning(
    redis_server: RedisServer, emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    meter = count_meter(emulator, credits=3)

    def unreachable() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and "Polar unreachable" in r.getMessage()
        ]

    with caplog.at_level(logging.INFO, logger="outpost"):
        async with connect(redis_server, emulator) as a:
            await a.balance(meter, external_customer_id="c1")
            emulator.stop()  # Polar goes away; the instance tries to reconnect, and fails
            await eventually(holds(lambda: bool(unreachable())), what="a WARNING")
            await eventually(holds(lambda: not a.connected), what="the link down")
    assert len(unreachable()) == 1, unreachable()
    assert "the WebSocket" in unreachable()[0]


@pytest.mark.anyio
async def test_close_does_not_wait_on_a_flush_that_a_refused_token_stalls(
    redis_server: RedisServer, emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    # The first instance leaves Polar's configuration in Redis.
    async with metered(redis_server, emulator, credits=3) as (meter, good):
        await good.balance(meter, external_customer_id="c1")
    wrong = AsyncOutpost(
        access_token="polar_oat_wrong",
        server_url=emulator.url,
        redis_url=redis_server.url,
        clock=emulator.clock,
        linger=0.02,
        telemetry=False,
    )
    async with wrong:
        await wrong.track("api_call", external_customer_id="c1")
        await eventually(holds(lambda: wrong.delivery_stalled is not None), what="a stall")
        with caplog.at_level(logging.WARNING, logger="outpost"):
            await wrong.close()
    said = [r.getMessage() for r in caplog.records if "closes without flushing" in r.getMessage()]
    assert len(said) == 1 and "401" in said[0], said


@pytest.mark.anyio
async def test_a_refused_token_over_an_earlier_configuration_is_named(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    # The meter exists before the instance connects: one made after would reach it in a pushed
    # configuration, and a read before that push raises UnknownMeter (Polar's figure had no such
    # meter yet), which the busy machine in CI showed once.
    first = count_meter(emulator, credits=3)
    async with connect(redis_server, emulator) as good:  # leaves Polar's configuration in Redis
        await good.balance(first, external_customer_id="c1")
    newer = count_meter(emulator, credits=3)  # not in the configuration Redis holds
    async with instance(redis_server, emulator.url, "polar_oat_wrong") as wrong:
        with contextlib.suppress(OutpostError):  # starts it (the refusal may not be known yet)
            await wrong.balance(newer, external_customer_id="c1")
        await eventually(holds(lambda: wrong.status.websocket_error is not None), what="refusal")
        with pytest.raises(NotReady, match=r"not in the configuration cached in Redis.*HTTP 401"):
            await wrong.balance(newer, external_customer_id="c1")
