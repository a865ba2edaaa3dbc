"""The outbox streams' Redis commands that are not the delivery loop's reads: claims, the
instances' heartbeats and surveys, reclaiming what a dead instance held, and the commands a
flush or a start runs on every stream (one pipeline on one Redis, one at a time on a cluster).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ResponseError

from outpost_async._context import DriverContext
from outpost_async._scripts import run_script
from outpost_core import (
    GROUP,
    Beat,
    CheckHeartbeats,
    ClaimStale,
    ConsumersListed,
    DeliveryAnswer,
    Done,
    ForgetHeartbeat,
    HeartbeatsChecked,
    OutboxRead,
    Reclaim,
    Reclaimed,
    RefreshClaim,
    StreamEntry,
    SurveyConsumers,
    claimed_entries,
)


async def per_stream(
    ctx: DriverContext, streams: Sequence[str], command: Callable[[Any, str], Any]
) -> list[Any]:
    """``command(client, stream)`` for each of ``streams``: on one Redis in one round trip (a
    pipeline), on a cluster one at a time; each reply, or the error it was."""
    if ctx.cluster is not None:
        replies: list[Any] = []
        for stream in streams:
            try:
                replies.append(await command(ctx.redis, stream))
            except ResponseError as exc:
                replies.append(exc)
        return replies
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for stream in streams:
            command(pipe, stream)
        return list(await pipe.execute(raise_on_error=False))


async def refresh_claim(ctx: DriverContext, action: RefreshClaim) -> DeliveryAnswer:
    for stream, ids in action.by_stream().items():
        claimed: list[Any] = ids  # redis-py's stub wants a list of its own union
        await ctx.redis.xclaim(stream, GROUP, ctx.consumer, 0, claimed, justid=True)
    return Done()


async def claim_stale(ctx: DriverContext, action: ClaimStale) -> DeliveryAnswer:
    replies = await per_stream(
        ctx,
        ctx.outboxes,
        lambda client, stream: client.xautoclaim(
            stream,
            GROUP,
            ctx.consumer,
            int(action.min_idle * 1000),
            start_id="0-0",
            count=action.count,
        ),
    )
    entries: list[StreamEntry] = []
    for stream, reply in zip(ctx.outboxes, raising(replies), strict=True):
        entries += claimed_entries(stream, reply)
    return OutboxRead(entries)


async def beat(ctx: DriverContext, action: Beat) -> DeliveryAnswer:
    await ctx.redis.set(action.key, b"1", px=action.ttl_ms)
    return Done()


async def survey(ctx: DriverContext, action: SurveyConsumers) -> DeliveryAnswer:
    replies = await per_stream(
        ctx, ctx.outboxes, lambda client, stream: client.xinfo_consumers(stream, GROUP)
    )
    return ConsumersListed(list(zip(ctx.outboxes, raising(replies), strict=True)))


async def check_heartbeats(ctx: DriverContext, action: CheckHeartbeats) -> DeliveryAnswer:
    return HeartbeatsChecked(await ctx.redis.mget(action.keys))


async def reclaim(ctx: DriverContext, action: Reclaim) -> DeliveryAnswer:
    args = [GROUP, action.taker, str(action.count), *action.consumers]
    reply = await run_script(ctx, "reclaim", (action.stream,), args)
    return Reclaimed(action.stream, reply)


async def forget_heartbeat(ctx: DriverContext, action: ForgetHeartbeat) -> DeliveryAnswer:
    await ctx.redis.delete(action.key)
    return Done()


def failed(reply: Any) -> bool:
    return isinstance(reply, Exception)


def raising(replies: list[Any]) -> list[Any]:
    """``replies``, or the first error among them raised."""
    for reply in replies:
        if failed(reply):
            raise reply
    return replies


def read_command(
    consumer: str, count: int, outboxes: tuple[str, ...], block: int = 0
) -> tuple[Any, ...]:
    """XREADGROUP of what no consumer has read yet from every outbox; ``block`` ms, 0: without
    blocking (a blocking read would hold up every command behind it on a shared connection)."""
    return (
        "XREADGROUP",
        "GROUP",
        GROUP,
        consumer,
        "COUNT",
        count,
        *(("BLOCK", block) if block else ()),
        "STREAMS",
        *outboxes,
        *(">",) * len(outboxes),
    )
