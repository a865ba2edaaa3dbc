# GENERATED from outpost_async/_shards.py by scripts/unasync.py: do not edit.
"""The deployment's shard count, agreed with Redis before the instance's first write.

The count decides every customer's keys, so an instance that counted differently from the others
would write the same customers under other keys, and no instance would count the other's events.
Read once, at start (``_lifecycle.py``): the hot path never asks Redis again.
"""

from __future__ import annotations

from outpost_core import (
    DEFAULT_SHARDS,
    SHARDS_KEY,
    ConfigurationError,
    RedisUnavailable,
    keys,
    shards,
)
from outpost_sync._context import DriverContext, redis_unavailable


def agree_on_shards(ctx: DriverContext) -> None:
    """Store the count where Redis holds none (the first instance); refuse to start, with
    :class:`ConfigurationError`, where Redis holds another."""
    try:
        with redis_unavailable("reading the deployment's shard count"):
            stored = ctx.redis.get(SHARDS_KEY)
            if stored is None:
                # Outbox streams but no count: instances that could not choose one, with 16.
                legacy = ctx.redis.exists(*keys.all_outboxes(DEFAULT_SHARDS))
                first = shards.first_count(ctx.shards, legacy=bool(legacy))
                ctx.redis.set(SHARDS_KEY, str(first), nx=True)  # a race: one wins
                stored = ctx.redis.get(SHARDS_KEY)
    except RedisUnavailable as exc:
        ctx.redis_failed(ctx.state_outage, exc)  # said once, then once a minute, while it lasts
        raise
    ctx.redis_answered(ctx.state_outage)
    why = shards.disagreement(ctx.shards, stored)
    if why is not None:
        raise ConfigurationError(why)
