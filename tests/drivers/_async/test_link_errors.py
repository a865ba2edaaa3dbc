"""A wrong token or server URL on a fresh Redis names its cause (issue 20.3): in the NotReady
message, in ``status``, and for a refused token in one ERROR line."""

from __future__ import annotations

import logging

import pytest

from outpost_async import AsyncOutpost, NotReady
from outpost_emulator import Emulator
from tests.drivers._async._helpers import count_meter
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
