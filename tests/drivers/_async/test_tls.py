"""The production path: Polar over TLS, ``wss://`` and HTTPS, with the CA
given as ``verify``; and a certificate that does not verify, which says so instead of hanging.
Both drivers, against the emulator served by uvicorn with a certificate from a test CA."""

from __future__ import annotations

import base64
import logging
import ssl
from collections.abc import Iterator

import pytest

from outpost_async import AsyncOutpost, NotReady
from outpost_core import UsageError
from outpost_emulator import Emulator
from outpost_io.proxy import ProxyError, proxy_for
from tests.conftest import CertificateAuthority
from tests.drivers._async._helpers import (
    CONFIGURATION,
    connect,
    count_meter,
    credited,
    eventually,
    holds,
    metered,
    until_credited,
)
from tests.drivers._async.test_snapshots import check_reconnection
from tests.support import polar
from tests.support.connect_proxy import ConnectProxy
from tests.support.redis_server import RedisServer


@pytest.mark.anyio
async def test_snapshots_and_pushes_arrive_over_wss(
    redis_server: RedisServer, tls_emulator: Emulator, authority: CertificateAuthority
) -> None:
    assert tls_emulator.url.startswith("https://")
    meter = count_meter(tls_emulator, credits=100)
    async with connect(redis_server, tls_emulator, verify=authority.bundle) as a:
        first = await a.balance(meter, external_customer_id="c1")
        assert (first.credited, first.balance) == (100, 100)
        assert a.connected
        tls_emulator.grant_credits(meter, 50, external_customer_id="c1")

        await until_credited(meter, "c1", 150, a, what="a pushed snapshot over wss://")


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["close", "abort"])
async def test_reconnects_over_wss_after_the_connection_drops(
    redis_server: RedisServer,
    tls_emulator: Emulator,
    authority: CertificateAuthority,
    mode: str,
) -> None:
    meter = count_meter(tls_emulator, credits=10)
    context = ssl.create_default_context()
    authority.authority.configure_trust(context)  # an SSLContext works as a bundle does
    async with connect(redis_server, tls_emulator, verify=context) as a:
        await check_reconnection(a, tls_emulator, meter, mode)


@pytest.mark.anyio
async def test_events_are_delivered_over_https(
    redis_server: RedisServer, tls_emulator: Emulator, authority: CertificateAuthority
) -> None:
    async with metered(redis_server, tls_emulator, verify=authority.bundle) as (meter, a):
        await a.balance(meter, external_customer_id="c1")
        for _ in range(20):
            await a.track("api_call", external_customer_id="c1")
        assert await a.flush(10)
        assert tls_emulator.state()["events"]["count"] == 20
        assert a.delivery_stalled is None

        async def counted() -> bool:
            b = await a.balance(meter, external_customer_id="c1")
            return b.undelivered == 0 and b.consumed == 20

        await eventually(counted, what="the delivered events acknowledged")


@pytest.mark.anyio
async def test_a_certificate_that_does_not_verify_is_named_not_waited_on(
    redis_server: RedisServer, tls_emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the test CA (certifi's bundle trusts nobody on loopback), nothing hangs: the
    read raises NotReady within its timeout naming the certificate, and delivery stalls with
    the same reason, logged as an error."""
    polar.store_configuration(redis_server.client(), CONFIGURATION)
    with caplog.at_level(logging.ERROR, logger="outpost"):
        async with connect(redis_server, tls_emulator, snapshot_timeout=1.0) as a:
            with pytest.raises(NotReady, match=r"TLS certificate of 127\.0\.0\.1 did not verify"):
                await a.balance("m-count", external_customer_id="c1")
            await a.track("api_call", external_customer_id="c1")
            stalled = holds(lambda: a.delivery_stalled is not None)
            await eventually(stalled, what="delivery stalled on the certificate")
            assert a.delivery_stalled is not None
            assert "TLS certificate of 127.0.0.1 did not verify" in a.delivery_stalled
            assert not a.connected
            await a.close(0.2)
    assert "outpost delivery is stalled: the TLS certificate of 127.0.0.1" in caplog.text
    assert tls_emulator.state()["events"]["count"] == 0


def test_a_bundle_that_cannot_be_loaded_raises_at_once(redis_server: RedisServer) -> None:
    with pytest.raises(UsageError, match="cannot load the CA certificates"):
        AsyncOutpost(redis_url=redis_server.url, verify="/nonexistent/ca.pem")
    with pytest.raises(UsageError, match="verify=False is not supported"):
        AsyncOutpost(redis_url=redis_server.url, verify=False)


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[ConnectProxy]:
    """A CONNECT proxy named in HTTPS_PROXY (with credentials), as a corporate network has."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    with ConnectProxy() as running:
        monkeypatch.setenv("HTTPS_PROXY", f"http://outpost:s%3Acret@127.0.0.1:{running.port}")
        yield running


@pytest.mark.anyio
async def test_the_websocket_and_ingestion_both_go_through_the_https_proxy(
    redis_server: RedisServer,
    tls_emulator: Emulator,
    authority: CertificateAuthority,
    proxy: ConnectProxy,
) -> None:
    meter = count_meter(tls_emulator, credits=10)
    async with connect(redis_server, tls_emulator, verify=authority.bundle) as a:
        assert await credited(a, meter, "c1") == 10  # the snapshot came over the tunnel
        await a.track("api_call", external_customer_id="c1")
        assert await a.flush(10)
        assert tls_emulator.state()["events"]["count"] == 1
    target = f"127.0.0.1:{tls_emulator.port}"
    assert proxy.tunnels.count(target) >= 2  # one for the WebSocket, one for ingestion
    expected = "Basic " + base64.b64encode(b"outpost:s:cret").decode()
    assert set(proxy.authorizations) == {expected}


@pytest.mark.anyio
async def test_a_proxy_that_refuses_the_tunnel_is_named(
    redis_server: RedisServer,
    tls_emulator: Emulator,
    authority: CertificateAuthority,
    proxy: ConnectProxy,
) -> None:
    proxy.refuse = "407 Proxy Authentication Required"
    polar.store_configuration(redis_server.client(), CONFIGURATION)
    async with connect(
        redis_server, tls_emulator, verify=authority.bundle, snapshot_timeout=1.0
    ) as a:
        with pytest.raises(NotReady, match=r"refused the tunnel .* 407 Proxy Authentication"):
            await a.balance("m-count", external_customer_id="c1")
        await a.track("api_call", external_customer_id="c1")
        stalled = holds(lambda: a.delivery_stalled is not None)
        await eventually(stalled, what="delivery stalled on the proxy")
        assert a.delivery_stalled is not None and "407" in a.delivery_stalled
        await a.close(0.2)
    assert tls_emulator.state()["events"]["count"] == 0


def test_no_proxy_and_the_scheme_choose_as_httpx_does(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "proxy.internal:3128")
    found = proxy_for("api.polar.sh", tls=True)
    assert found is not None and (found.host, found.port) == ("proxy.internal", 3128)
    assert proxy_for("api.polar.sh", tls=False) is None  # ws:// would take HTTP_PROXY
    monkeypatch.setenv("NO_PROXY", "localhost, .polar.sh")
    assert proxy_for("api.polar.sh", tls=True) is None
    assert proxy_for("polar.sh", tls=True) is not None  # ".polar.sh" is subdomains only
    monkeypatch.setenv("NO_PROXY", "polar.sh")
    assert proxy_for("api.polar.sh", tls=True) is None
    assert proxy_for("notpolar.sh", tls=True) is not None
    monkeypatch.setenv("NO_PROXY", "*")
    assert proxy_for("api.polar.sh", tls=True) is None
    monkeypatch.delenv("NO_PROXY")
    monkeypatch.setenv("HTTPS_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(ProxyError, match="only http:// proxies"):
        proxy_for("api.polar.sh", tls=True)
