from __future__ import annotations

from collections.abc import Iterator

import pytest

from outpost_emulator import Emulator
from tests.support.redis_server import RedisServer


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
def durable_redis_server() -> Iterator[RedisServer]:
    server = RedisServer(durable=True)
    server.start()
    yield server
    server.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sync_backend() -> str:
    return "threads"


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    """A local Polar on a free port, its clock running from now (tests advance it)."""
    with Emulator.start(port=0, sync_delay=1.0) as emu:
        yield emu
