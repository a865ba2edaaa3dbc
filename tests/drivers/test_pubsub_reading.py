"""The subscriber's read of its subscription: every reply that came, raw, in one call.

The sync subscriber thread takes the GIL from the callers each time it wakes, so it takes every
message one read of the socket brought, rather than one per wake-up; and it reads them from the
connection's hiredis reader, without redis-py's message layers. The async subscriber reads its
subscribed connection's transport itself (``PushListener``), dropping this instance's echoes as
they arrive. Against a real Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from outpost_async._backend import read_pubsub as read_async
from outpost_core import keys
from outpost_sync._backend import close_pubsub, open_pubsub
from outpost_sync._backend import read_pubsub as read_sync
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until, wait_until_async

CHANNEL = keys.channel(0)


def test_one_read_takes_every_message_that_came(redis_server: RedisServer) -> None:
    client = redis_server.client()
    pubsub = open_pubsub(client)
    pubsub.ssubscribe(CHANNEL)
    confirmations = read_sync(pubsub, 1.0)
    assert [reply[0] for reply in confirmations] == [b"ssubscribe"]
    for n in range(3):
        client.spublish(CHANNEL, f"m{n}")
    # All three on the socket before the read: one read then takes them all.
    one = f"*3\r\n$8\r\nsmessage\r\n${len(CHANNEL)}\r\n{CHANNEL}\r\n$2\r\nm0\r\n"
    wait_until(lambda: _socket_has(pubsub, 3 * len(one)), "three messages on the socket")
    replies = read_sync(pubsub, 1.0)
    assert replies == [[b"smessage", CHANNEL.encode(), f"m{n}".encode()] for n in range(3)]
    assert read_sync(pubsub, 0.01) == []  # nothing more: a quiet poll is an empty list
    pubsub.close()


def test_a_closed_connection_raises(redis_server: RedisServer) -> None:
    client = redis_server.client()
    pubsub = open_pubsub(client)
    pubsub.ssubscribe(CHANNEL)
    read_sync(pubsub, 1.0)
    client.client_kill_filter(_type="pubsub")
    with pytest.raises(redis.exceptions.ConnectionError):
        wait_until(lambda: bool(read_sync(pubsub, 0.05)) and False, "a broken connection")
    pubsub.close()


def test_the_async_read_takes_every_buffered_message(redis_server: RedisServer) -> None:
    async def main() -> None:
        client: Any = redis.asyncio.Redis.from_url(redis_server.url)
        pubsub = open_pubsub(client)
        await pubsub.ssubscribe(CHANNEL)
        assert [reply[0] for reply in await read_async(pubsub, 1.0)] == [b"ssubscribe"]
        for n in range(3):
            await client.spublish(CHANNEL, f"m{n}")
        got: list[object] = []
        while len(got) < 3:
            got += await read_async(pubsub, 1.0)
        assert got == [[b"smessage", CHANNEL.encode(), f"m{n}".encode()] for n in range(3)]
        await pubsub.aclose()
        await client.aclose()

    asyncio.run(main())


def _socket_has(pubsub: object, size: int) -> bool:
    """Whether the subscription's socket holds at least ``size`` unread bytes (FIONREAD)."""
    import fcntl
    import struct
    import termios

    sock = pubsub.connection._sock  # type: ignore[attr-defined]
    raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, struct.pack("i", 0))
    return int(struct.unpack("i", raw)[0]) >= size


def test_closing_a_cluster_subscription_closes_every_node_connection(
    redis_cluster: RedisCluster,
) -> None:
    # redis-py's ClusterPubSub.close() leaves its nodes' connections open (the CLI's doctor
    # subscribes through one): close_pubsub closes those too.
    owner: Any = redis.Redis(port=redis_cluster.port_for_slot(key_slot(CHANNEL.encode())))

    def subscribers() -> int:
        return int(owner.execute_command("PUBSUB", "SHARDNUMSUB", CHANNEL)[1])

    cluster: Any = redis_cluster.client()  # the CLI passes a cluster client as it passes one
    pubsub = open_pubsub(cluster)
    pubsub.ssubscribe(CHANNEL)
    wait_until(lambda: subscribers() == 1, "the subscription")
    close_pubsub(pubsub)
    wait_until(lambda: subscribers() == 0, "every node let go")
    owner.close()


@contextlib.asynccontextmanager
async def _subscribed(server: RedisServer, **options: Any) -> AsyncIterator[tuple[Any, Any]]:
    """An asyncio client and its subscription to ``CHANNEL``, both closed afterwards."""
    client: Any = redis.asyncio.Redis.from_url(server.url, **options)
    pubsub = open_pubsub(client)
    await pubsub.ssubscribe(CHANNEL)
    try:
        yield client, pubsub
    finally:
        await pubsub.aclose()  # redis-py closes what it opened, a dead stream included
        await client.aclose()


@pytest.mark.anyio
async def test_the_async_read_drops_echoes_as_they_come(redis_server: RedisServer) -> None:
    async with _subscribed(redis_server) as (client, pubsub):
        echoes = {b"mine-1", b"mine-2"}

        def drop(reply: Any) -> bool:
            return reply[0] == b"smessage" and reply[2] in echoes

        assert [reply[0] for reply in await read_async(pubsub, 1.0, drop)] == [b"ssubscribe"]
        for data in ("mine-1", "theirs", "mine-2"):
            await client.spublish(CHANNEL, data)
        assert await read_async(pubsub, 5.0, drop) == [[b"smessage", CHANNEL.encode(), b"theirs"]]
        await client.spublish(CHANNEL, "mine-1")
        assert await read_async(pubsub, 0.2, drop) == []  # only an echo came: nothing to read


@pytest.mark.anyio
async def test_the_async_read_keeps_what_redis_py_had_read_already(
    redis_server: RedisServer,
) -> None:
    async with _subscribed(redis_server) as (client, pubsub):
        for n in range(3):
            await client.spublish(CHANNEL, f"m{n}")
        stream = pubsub.connection._reader  # redis-py's stream: the bytes wait there, unparsed
        await wait_until_async(lambda: len(stream._buffer) > 0, "the replies in redis-py's stream")
        got: list[Any] = []
        while len(got) < 4:
            got += await read_async(pubsub, 1.0)
        assert got[0][0] == b"ssubscribe"
        assert got[1:] == [[b"smessage", CHANNEL.encode(), f"m{n}".encode()] for n in range(3)]


@pytest.mark.anyio
async def test_the_async_read_checks_a_quiet_connection_and_hides_the_check(
    redis_server: RedisServer,
) -> None:
    async with _subscribed(redis_server, health_check_interval=0.05) as (client, pubsub):
        await read_async(pubsub, 1.0)  # the confirmation

        def pings() -> int:
            stats = redis_server.client().info("commandstats")
            return int(stats.get("cmdstat_ping", {}).get("calls", 0))

        for _ in range(5):
            assert await read_async(pubsub, 0.1) == []  # the answers to the checks are not news
        assert pings() >= 2
        await client.spublish(CHANNEL, "m")
        assert await read_async(pubsub, 1.0) == [[b"smessage", CHANNEL.encode(), b"m"]]


@pytest.mark.anyio
async def test_the_async_read_raises_once_the_connection_is_closed(
    redis_server: RedisServer,
) -> None:
    async with _subscribed(redis_server) as (client, pubsub):
        await read_async(pubsub, 1.0)
        await client.client_kill_filter(_type="pubsub")
        with pytest.raises(redis.exceptions.ConnectionError):
            for _ in range(200):
                await read_async(pubsub, 0.05)
