"""A delivery loop's read on Redis Cluster, one stream at a time, asks each stream for as many
entries as the read's count, as one read of every stream does on one Redis: a loop asks each
stream for its share of a batch."""

from __future__ import annotations

import contextlib

import pytest
import redis

from outpost_async import AsyncOutpost
from outpost_core import GROUP, OutboxRead, ReadOutbox, text_of
from outpost_emulator import Emulator
from tests.support.redis_cluster import RedisCluster
from tests.support.wiring import shards_of


@pytest.mark.anyio
async def test_a_read_asks_each_stream_for_its_count(
    redis_cluster: RedisCluster, emulator: Emulator
) -> None:
    # No token: no delivery loop of its own reads the entries first.
    a = AsyncOutpost(
        access_token=None,
        server_url=emulator.url,
        redis_url=redis_cluster.url,
        shards=shards_of(redis_cluster),
        telemetry=False,
    )
    async with a:
        await a._lifecycle.ensure_started()
        client = redis_cluster.client()
        streams = a._context.outboxes[:4]
        for stream in a._context.outboxes:
            with contextlib.suppress(redis.ResponseError):  # made by an earlier test
                client.xgroup_create(stream, GROUP, id="$", mkstream=True)
        for stream in streams:
            for n in range(3):
                client.xadd(stream, {"e": "{}", "f": f"0:{n}", "k": "[]"})
        read = await a._delivery._act_once(ReadOutbox(count=2, block=0.0))
        assert isinstance(read, OutboxRead)
        found = sorted(text_of(entry[0]) or "" for entry in read.entries)
        assert found == sorted(stream for stream in streams for _ in range(2))
