"""One real redis-server for the script tests; every test starts from an empty database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.lua._scripts import CHANNEL, Channel, Scripts, reset_revisions
from tests.support.redis_server import RedisServer, running


@pytest.fixture(scope="session")
def lua_server() -> Iterator[RedisServer]:
    with running() as server:
        yield server


@pytest.fixture
def client(lua_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis(port=lua_server.port, socket_timeout=10)
    client.flushall()
    reset_revisions()
    yield client
    client.close()


@pytest.fixture
def scripts(client: redis.Redis) -> Scripts:
    return Scripts(client)


@pytest.fixture
def channel(lua_server: RedisServer, client: redis.Redis) -> Iterator[Channel]:
    listener = redis.Redis(port=lua_server.port, socket_timeout=10)
    pubsub = listener.pubsub()  # type: ignore[no-untyped-call,unused-ignore]
    pubsub.ssubscribe(CHANNEL)
    subscribed = pubsub.get_sharded_message(timeout=5)
    assert subscribed is not None and subscribed["type"] == "ssubscribe"
    yield Channel(client, pubsub)
    pubsub.close()
    listener.close()
