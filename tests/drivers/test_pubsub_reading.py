"""The subscriber's read of its subscription: every reply that came, raw, in one call.

The sync subscriber thread takes the GIL from the callers each time it wakes, so it takes every
message one read of the socket brought, rather than one per wake-up; and it reads them from the
connection's hiredis reader, without redis-py's message layers. Against a real Redis.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio

from outpost_async._backend import read_pubsub as read_async
from outpost_sync._backend import open_pubsub
from outpost_sync._backend import read_pubsub as read_sync
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

CHANNEL = "outpost:v1:{0}:changes"


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
