"""`outpost demo`: the whole run in a subprocess, and how it finds (or fails to find) Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import redis

from outpost_sync.cli import demo
from outpost_sync.cli import main as cli_main
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_server import REDIS_SERVER, RedisServer, free_port


@pytest.fixture(params=["single", "cluster"])
def demo_redis(request: pytest.FixtureRequest) -> RedisServer | RedisCluster:
    """One Redis, then the shared cluster (``--redis-url redis+cluster://...``)."""
    name = "redis_server" if request.param == "single" else "redis_cluster"
    redis_or_cluster: RedisServer | RedisCluster = request.getfixturevalue(name)
    return redis_or_cluster


def _run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    """`outpost demo` in a subprocess, REDIS_URL unset, which must exit 0."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    result = subprocess.run(
        [sys.executable, "-m", "outpost_sync.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=80,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_demo_ends_with_an_agreeing_verdict(demo_redis: RedisServer | RedisCluster) -> None:
    redis_server = demo_redis
    result = _run_demo("--fast", "--plain", "--redis-url", redis_server.url)
    out = result.stdout
    verdict = [line for line in out.splitlines() if line.startswith("VERDICT:")]
    assert len(verdict) == 1 and verdict[0].startswith(
        "VERDICT: OK: instances A and B agree with each other and with Polar's balance"
    )
    # A customer at zero gets 5 credits; A and B race for them: exactly 5 admitted, Polar counts 5.
    assert re.search(r"demo-\w+-zero has no credits: reserve\(\) on A and B refuses it", out)
    race = re.search(
        r"admitted (\d+) \(A (\d+), B (\d+)\), refused (\d+) with InsufficientBalance", out
    )
    assert race is not None, out[-3000:]
    admitted, on_a, on_b, refused = (int(group) for group in race.groups())
    assert admitted == on_a + on_b == 5 and admitted + refused == 48
    assert verdict[0].endswith(
        "exactly 5 of 48 racing reservations admitted for 5 credits, and Polar counts 5."
    )
    for step in ("closed", "synced", "sealed"):  # both buckets, in that order
        assert len(re.findall(rf"bucket \d\d:\d\d-\d\d:\d\d {step}\b", out)) == 2, step
    assert "\x1b[" not in out  # no ANSI redraw when stdout is not a terminal
    assert result.stderr == ""
    # The demo never flushes Redis; its keys stay, under the layout's prefix only.
    found = redis_server.client().scan_iter()
    keys = [k.decode() if isinstance(k, bytes) else str(k) for k in found]
    assert keys and all(key.startswith("outpost:v2:") for key in keys)


def test_demo_help_goes_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main(["demo", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--fast" in out and "--redis-url" in out


def test_redis_from_redis_url(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    choice = demo.find_redis(None)
    assert choice.url == redis_server.url and choice.server is None
    assert "REDIS_URL" in choice.description


def test_an_unreachable_redis_url_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(demo.RedisNotFound, match="does not answer"):
        demo.find_redis(None)


def test_database_15_of_a_local_redis(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(demo, "LOCAL_REDIS", ("127.0.0.1", redis_server.port))
    choice = demo.find_redis(None)
    assert choice.url == f"redis://127.0.0.1:{redis_server.port}/15"
    assert choice.server is None and "database 15" in choice.description


@pytest.mark.skipif(REDIS_SERVER is None, reason="needs redis-server on PATH")
def test_starts_its_own_redis_server_and_stops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(demo, "LOCAL_REDIS", ("127.0.0.1", free_port()))  # nothing listens
    choice = demo.find_redis(None)
    try:
        assert choice.server is not None
        assert "started for the demo" in choice.description
        client = redis.Redis.from_url(choice.url)
        assert client.ping()
        client.close()
        directory = choice.server.directory
    finally:
        choice.stop()
    assert choice.server is None and not directory.exists()


def test_without_any_redis_it_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(demo, "LOCAL_REDIS", ("127.0.0.1", free_port()))
    monkeypatch.setenv("PATH", "")  # no redis-server to start
    assert demo.main(["--fast"]) == 2
    err = capsys.readouterr().err
    assert "apt-get install redis-server" in err and "brew install redis" in err
    assert "redis-stable" in err and "REDIS_URL" in err


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_public_only_demo_ends_with_an_agreeing_verdict(redis_server: RedisServer) -> None:
    result = _run_demo("--public-only", "--fast", "--plain", "--redis-url", redis_server.url)
    out = result.stdout
    assert "A: mode public (Polar answers 404 on /v1/outpost/" in out
    verdict = [line for line in out.splitlines() if line.startswith("VERDICT:")]
    assert len(verdict) == 1 and verdict[0].startswith(
        "VERDICT: OK: in the public-API mode, instances A and B never read above Polar's balance"
    )
