"""`outpost shards`: the deployment's shard count, and `outpost shards set <count>` to choose
another while no instance runs (docs/redis-layout.md, "Another shard count").

The count decides which keys, outbox stream and channel each customer has, so it changes only
while nothing is in flight: no instance alive in the outbox group and no entry in any outbox
stream, of the current count or the new one. What Redis holds of a customer whose shard changes
stays under its old keys, which no instance reads again (they expire on their own); the
instances load such a customer from Polar's snapshots, as a new layout does.
"""

from __future__ import annotations

import argparse
from typing import Any

import redis

from outpost_core import (
    DEFAULT_SHARDS,
    MAX_SHARDS,
    SHARDS_KEY,
    ConfigurationError,
    keys,
    shards,
)
from outpost_sync.cli import _outbox
from outpost_sync.cli._config import (
    add_connection_arguments,
    deployment_shards,
    fail,
    print_json,
    redis_client,
    redis_failure,
    stored_shards,
    text,
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "shards",
        help="the deployment's shard count; `set <count>` changes it while no instance runs",
        description="Show the shard count stored in Redis (every instance must be configured "
        "with it), or set another one: refused while an instance is alive or an outbox stream "
        "holds an entry (flush() and close() every instance first).",
    )
    parser.add_argument(
        "action", nargs="?", choices=["status", "set"], default="status", help="(default: status)"
    )
    parser.add_argument("count", nargs="?", type=int, help="the new count (with `set`)")
    add_connection_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "set" and args.count is None:
        return fail("shards", "`outpost shards set` needs the new count", args)
    client = redis_client(args)
    try:
        if args.action == "set":
            return _set(args, client, shards.checked(args.count))
        stored = stored_shards(client)
        result = {"shards": deployment_shards(client), "stored": stored is not None}
        result.update(spread(client, result["shards"]))
    except (redis.RedisError, ConfigurationError) as exc:
        return fail("shards", redis_failure(args, exc), args)
    finally:
        client.close()
    if args.json:
        print_json(result)
    else:
        origin = f"stored at {SHARDS_KEY}" if stored is not None else "none stored: the default"
        print(f"{result['shards']} shards ({origin}){_spread_line(result)}")
    return 0


def spread(client: redis.Redis, count: int) -> dict[str, int]:
    """On a cluster: how many primaries own some shard, of how many."""
    if not isinstance(client, redis.RedisCluster):
        return {}
    owners = {client.get_node_from_key(keys.tag_of(shard)).name for shard in range(count)}
    return {"primaries_used": len(owners), "primaries": len(client.get_primaries())}


def _spread_line(result: dict[str, Any]) -> str:
    if "primaries" not in result:
        return ""
    return f"; spread over {result['primaries_used']} of {result['primaries']} primaries"


def _set(args: argparse.Namespace, client: redis.Redis, count: int) -> int:
    raw = client.get(SHARDS_KEY)
    current = shards.parse(raw)
    # Where the stored count is unreadable, any stream may hold entries: every one is read.
    now = current or (DEFAULT_SHARDS if raw is None else MAX_SHARDS)
    if current == count:
        return _done(args, count, now, "unchanged")
    # Nothing in flight, under either count: the streams of both are read.
    state = _outbox.gather(client, max(now, count))
    # An instance beats before it joins the outbox group (at its first read): both are looked at.
    beating = [text(k) for k in client.scan_iter(match=f"{keys.FLEET_TAG}alive:*")]
    alive = sorted({c.name for c in state.consumers if c.alive} | set(beating))
    if alive:
        why = (
            f"{len(alive)} instances are alive ({', '.join(alive[:3])}): "
            "flush() and close() every instance before changing the shard count"
        )
        return fail("shards", why, args)
    waiting = sum(state.depth)
    if waiting:
        why = (
            f"{waiting} entries wait in the outbox streams: start the instances with their "
            f"current count ({now}), flush() and close() them, then set the count"
        )
        return fail("shards", why, args)
    if client.get(SHARDS_KEY) != raw:  # another operator, or an instance that just started
        return fail("shards", "the stored count changed meanwhile: look again", args)
    client.set(SHARDS_KEY, str(count))
    return _done(args, count, DEFAULT_SHARDS if raw is None else current, "changed")


def _done(args: argparse.Namespace, count: int, before: int | None, outcome: str) -> int:
    """``before``: ``None`` when the stored count was unreadable."""
    if args.json:
        print_json({"shards": count, "before": before, "outcome": outcome})
    else:
        had = "an unreadable count" if before is None else before
        print(
            f"the deployment has {count} shards ({outcome}; it had {had}): start its "
            f"instances with shards={count}"
        )
    return 0
