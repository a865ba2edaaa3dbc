"""pytest fixtures for an application's own tests of its metering (installed with the ``emulator``
extra; pytest loads it by itself, ``-p no:outpost`` turns it off).

- ``outpost_redis_url``: a private ``redis-server`` started once per session from ``PATH`` and
  flushed before each test; or, when ``REDIS_URL`` is set, that Redis as it is (never flushed).
- ``outpost_emulator``: a local Polar (:class:`outpost_emulator.Emulator`) in this process, on a
  free loopback port, one per test, its clock running from now.
- ``outpost_polar``: helpers on that emulator: ``create_meter``, ``grant``, ``balance`` (Polar's
  own), ``advance`` and ``sync`` (Polar's syncs and seals of every bucket so far).
- ``outpost_config``: the keyword arguments of an instance wired to both (sharing the emulator's
  clock); ``outpost_env``: the same as the environment variables an application reads.
- ``outpost``: an :class:`outpost_sync.Outpost`; ``async_outpost``: an
  :class:`outpost_async.AsyncOutpost` (an async fixture: for tests run by anyio's pytest plugin or
  pytest-asyncio in auto mode). Each starts on its first call, with the meters the test created
  before it; both are closed after the test.

Importing this module costs nothing: the emulator, its web server and the drivers are imported by
the fixtures that use them (a package of its own, so that pytest loading it imports no SDK
package before a coverage measurement starts).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from outpost_async import AsyncOutpost
    from outpost_emulator import Emulator
    from outpost_sync import Outpost

# Past the end of every bucket so far (5 minutes), Polar's sync of it and its seal (11 minutes
# after its end): after this the emulator has pushed the snapshots that cover every event.
SYNC_ADVANCE = 17 * 60.0


class Polar:
    """What a test asks of the local Polar: meters, credits, its own balance, its clock."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator

    def create_meter(
        self,
        event: str = "api_call",
        *,
        aggregation: str = "count",
        property: str | None = None,
        name: str | None = None,
    ) -> str:
        """A meter over the events named ``event``: ``aggregation`` ``count`` (the default), or
        ``sum``, ``max``, ``min``, ``avg`` of the metadata ``property``. Returns its id."""
        spec: dict[str, Any] = {"func": aggregation}
        if property is not None:
            spec["property"] = property
        clause = {"property": "name", "operator": "eq", "value": event}
        meter = self.emulator.create_meter(
            name or event, {"conjunction": "and", "clauses": [clause]}, spec
        )
        return str(meter["id"])

    def grant(
        self,
        meter_id: str,
        units: int,
        *,
        external_customer_id: str | None = None,
        customer_id: str | None = None,
    ) -> float:
        """Credit (negative: revoke) ``units``; returns the customer's credited units now."""
        granted = self.emulator.grant_credits(
            meter_id, units, external_customer_id=external_customer_id, customer_id=customer_id
        )
        return float(granted["credited_units"])

    def balance(
        self,
        meter_id: str,
        *,
        external_customer_id: str | None = None,
        customer_id: str | None = None,
    ) -> float:
        """Polar's own balance of the customer (the events it ingested so far count)."""
        row = self.emulator.customer_meter(
            meter_id, external_customer_id=external_customer_id, customer_id=customer_id
        )
        return float(row["balance"])

    def advance(self, seconds: float) -> None:
        """Move Polar's clock (the instances' too) forward; Polar's syncs due by then run."""
        self.emulator.advance(seconds)

    def sync(self) -> None:
        """Run Polar's syncs and seals of every bucket so far: Polar pushes the snapshots that
        count the events it ingested (``flush()`` an instance first to hand it its events)."""
        self.emulator.advance(SYNC_ADVANCE)


@pytest.fixture(scope="session")
def _outpost_redis_server() -> Iterator[str | None]:
    """The session's private redis-server's URL, or None when ``REDIS_URL`` names one to use."""
    if os.environ.get("REDIS_URL"):
        yield None
        return
    from outpost_emulator.redis_server import REDIS_SERVER, running

    if REDIS_SERVER is None:
        pytest.fail(
            "the outpost fixtures start a redis-server from PATH and there is none: install "
            "Redis 7+ (e.g. `apt-get install redis-server`, `brew install redis`) or set REDIS_URL"
        )
    with running() as server:
        yield server.url


@pytest.fixture
def outpost_redis_url(_outpost_redis_server: str | None) -> str:
    """A Redis for the test: the private one, flushed; or ``REDIS_URL``, untouched."""
    if _outpost_redis_server is None:
        return os.environ["REDIS_URL"]
    import redis

    client = redis.Redis.from_url(_outpost_redis_server)
    try:
        client.flushall()
    finally:
        client.close()
    return _outpost_redis_server


@pytest.fixture
def outpost_emulator() -> Iterator[Emulator]:
    """A local Polar on a free loopback port, its clock running from now."""
    from outpost_emulator import Emulator

    with Emulator.start(port=0, sync_delay=1.0) as emulator:
        yield emulator


@pytest.fixture
def outpost_polar(outpost_emulator: Emulator) -> Polar:
    return Polar(outpost_emulator)


@pytest.fixture
def outpost_config(outpost_emulator: Emulator, outpost_redis_url: str) -> dict[str, Any]:
    """Keyword arguments for ``Outpost(**outpost_config)`` / ``AsyncOutpost(...)``: the emulator,
    its clock and token, the test's Redis; short delays so that tests do not wait."""
    return {
        "access_token": outpost_emulator.token,
        "server_url": outpost_emulator.url,
        "redis_url": outpost_redis_url,
        "clock": outpost_emulator.clock,
        "linger": 0.02,
        "retry_base": 0.05,
        "telemetry": False,
    }


@pytest.fixture
def outpost_env(
    monkeypatch: pytest.MonkeyPatch, outpost_emulator: Emulator, outpost_redis_url: str
) -> dict[str, str]:
    """Sets (for the test) the variables an application's ``Outpost()`` reads by default."""
    env = {
        "POLAR_ACCESS_TOKEN": outpost_emulator.token,
        "POLAR_SERVER_URL": outpost_emulator.url,
        "REDIS_URL": outpost_redis_url,
        "POLAR_OUTPOST_TELEMETRY": "0",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def outpost(outpost_config: dict[str, Any]) -> Iterator[Outpost]:
    """An instance that starts on its first call, so that it starts with the meters the test
    created first (one started before a meter exists learns it from Polar a moment later: an
    event tracked meanwhile does not count in it locally)."""
    from outpost_sync import Outpost

    instance = Outpost(**outpost_config)
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
async def async_outpost(outpost_config: dict[str, Any]) -> AsyncIterator[AsyncOutpost]:
    """The async twin of ``outpost``: it starts on its first call too."""
    from outpost_async import AsyncOutpost

    instance = AsyncOutpost(**outpost_config)
    try:
        yield instance
    finally:
        await instance.close()
