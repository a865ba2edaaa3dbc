"""The subscriber's read of its subscription: every reply that came, raw, in one call.

The sync subscriber thread takes the GIL from the callers each time it wakes, so it takes every
message one read of the socket brought, rather than one per wake-up; and it reads them from the
connection's hiredis reader, without redis-py's message layers. Against a real Redis.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from outpost_async._backend import read_pubsub as read_async
from outpost_core import keys
from outpost_sync._backend import close_pubsub, open_pubsub
from outpost_sync._backend import read_pubsub as read_sync
from tests.support.redis_server import RedisCluster, RedisServer
from tests.support.waiting import wait_until

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
