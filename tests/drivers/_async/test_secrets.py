"""No secret reaches an output: a session with a Redis password, a proxy URL with a password and
an access token, whose every output (logs at DEBUG, exceptions, status, the operator commands'
text and JSON) is searched for the three."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis

from outpost_async import AsyncOutpost, NotReady
from outpost_core import ConnectionOptions
from outpost_emulator import Emulator
from outpost_sync.cli import main
from tests.drivers._async._helpers import CONFIGURATION
from tests.support import polar
from tests.support.redis_server import RedisServer, free_port

REDIS_PASSWORD = "redis-pw-7f3a"
PROXY_PASSWORD = "proxy-pw-91c2"


@pytest.fixture
def locked_redis(redis_server: RedisServer) -> Iterator[str]:
    """The test Redis with ``requirepass`` (and Polar's configuration cached, so that track()
    works without the WebSocket): its URL carries the password."""
    client = redis.Redis(port=redis_server.port)
    polar.store_configuration(client, CONFIGURATION)
    client.config_set("requirepass", REDIS_PASSWORD)
    client.close()
    yield f"redis://:{REDIS_PASSWORD}@127.0.0.1:{redis_server.port}/0"


@pytest.fixture
def bad_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy URL the WebSocket cannot use (its scheme), with a password."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    proxy = f"https://bob:{PROXY_PASSWORD}@127.0.0.1:{free_port()}"
    monkeypatch.setenv("HTTP_PROXY", proxy)
    monkeypatch.setenv("HTTPS_PROXY", proxy)


def assert_no_secret(text: str, token: str) -> None:
    for secret in (token, REDIS_PASSWORD, PROXY_PASSWORD):
        assert secret not in text, f"a secret in: {text[max(0, text.find(secret) - 200) :][:400]}"


@pytest.mark.anyio
async def test_no_output_of_a_session_holds_a_secret(
    locked_redis: str,
    emulator: Emulator,
    bad_proxy: None,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    outputs: list[str] = []
    meter = "m-count"
    async with AsyncOutpost(
        access_token=emulator.token,
        server_url=emulator.url,
        redis_url=locked_redis,
        clock=emulator.clock,
        telemetry=False,
        snapshot_timeout=0.5,
    ) as a:
        with pytest.raises(NotReady) as raised:
            await a.balance(meter, external_customer_id="c1")
        outputs += [str(raised.value), repr(raised.value)]
        await a.track("api_call", external_customer_id="c1")
        outputs += [repr(a.status), str(a.status), repr(a.rejections)]
        assert a.status.websocket_error is not None and "***" in a.status.websocket_error
        await a.close(0.2)
    options = ConnectionOptions.resolve({}, access_token=emulator.token, redis_url=locked_redis)
    outputs.append(repr(options))
    down = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{free_port()}/0"
    where = ["--server-url", emulator.url, "--token", emulator.token]
    inspect = ["inspect", meter, "--external-customer-id", "c1"]
    for extra in ([], ["--json"]):
        for command in (["doctor"], ["outbox"], inspect):
            main([*command, "--redis-url", locked_redis, *where, *extra])
            main([*command, "--redis-url", down, *where, *extra])
    out, err = capsys.readouterr()
    outputs += [out, err, caplog.text]
    assert "***" in out  # the URLs were printed, masked
    assert_no_secret("\n".join(outputs), emulator.token)


def test_reprs_hold_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    from outpost_io.proxy import proxy_for

    monkeypatch.setenv("HTTPS_PROXY", f"http://bob:{PROXY_PASSWORD}@proxy.internal:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    proxy = proxy_for("api.polar.sh", tls=True)
    assert proxy is not None and proxy.authorization is not None
    assert proxy.authorization not in repr(proxy) and PROXY_PASSWORD not in repr(proxy)


def test_a_token_over_plain_http_to_another_host_is_warned_once(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="outpost")
    instance = AsyncOutpost(
        access_token="polar_oat_secret", server_url="http://polar.internal:8000",
        telemetry_url="http://relay.internal:9000", redis_url=redis_server.url,
    )  # fmt: skip
    warnings = [r.getMessage() for r in caplog.records if "plain http://" in r.getMessage()]
    assert len(warnings) == 2 and "polar.internal" in warnings[0] and "relay" in warnings[1]
    assert "polar_oat_secret" not in caplog.text
    del instance
