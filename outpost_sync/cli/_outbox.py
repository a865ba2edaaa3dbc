"""`outpost outbox`: the delivery queue (depth per shard, oldest entry, consumers alive or
gone), and `outpost outbox release` to hand what gone instances hold to the live ones at once."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import redis

from outpost_core import GROUP, SCRIPT_TEXT, ConfigurationError, keys
from outpost_core.doctor import ConsumerState, OutboxState, Severity, Verdict, outbox, overall
from outpost_sync.cli._config import (
    add_connection_arguments,
    deployment_shards,
    fail,
    print_json,
    redis_client,
    redis_failure,
    text,
)

RELEASED = "outpost-released"
"""The consumer `release` moves entries to: it has no heartbeat, so any live instance's next
survey (a quarter of a heartbeat, 2.5 s by default) takes them; the next instance to start does
when none is alive."""
BATCH = 1000


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "outbox",
        help="the delivery queue: depth, oldest entry, consumers alive or gone",
        description="Show the outbox (events waiting for delivery to Polar) and who holds them; "
        "`release` hands the entries of gone instances over at once and removes them from the "
        "consumer group.",
    )
    parser.add_argument(
        "action",
        nargs="?",
        choices=["status", "release"],
        default="status",
        help="(default: status)",
    )
    add_connection_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    client = redis_client(args)
    try:
        if args.action == "release":
            return _release(args, client)
        state = gather(client)
    except (redis.RedisError, ConfigurationError) as exc:
        return fail("outbox", redis_failure(args, exc), args)
    finally:
        client.close()
    verdict = outbox(state)
    if args.json:
        print_json({**as_json(state), "verdict": _verdict_json(verdict)})
    else:
        print(render(state, verdict))
    return overall([verdict])


def gather(client: redis.Redis, shards: int | None = None) -> OutboxState:
    """Read the depth of each stream of the deployment's shards (or of the first ``shards``),
    the oldest entry and every consumer with its heartbeat."""
    count = deployment_shards(client) if shards is None else shards
    now_ms = time.time_ns() // 1_000_000
    depth: list[int] = []
    oldest: int | None = None
    held: dict[str, int] = {}
    for stream in keys.all_outboxes(count):
        depth.append(int(client.xlen(stream)))
        first = client.xrange(stream, count=1)
        if first:
            ms = int(text(first[0][0]).split("-")[0])
            oldest = ms if oldest is None else min(oldest, ms)
        try:
            consumers = client.xinfo_consumers(stream, GROUP)
        except redis.ResponseError:  # no group yet: no instance with a token ever ran
            consumers = []
        for consumer in consumers:
            name = text(consumer["name"])
            held[name] = held.get(name, 0) + int(consumer["pending"])
    names = sorted(held)
    beats = client.mget([keys.heartbeat_key(n) for n in names]) if names else []
    states = [
        ConsumerState(name, held[name], beat is not None, released=name == RELEASED)
        for name, beat in zip(names, beats, strict=True)
    ]
    age = None if oldest is None else max(0, now_ms - oldest) / 1000
    return OutboxState(depth=depth, oldest_age_s=age, consumers=states)


def _release(args: argparse.Namespace, client: redis.Redis) -> int:
    state = gather(client)
    gone = [c.name for c in state.consumers if not c.alive and c.name != RELEASED]
    reclaim = client.register_script(SCRIPT_TEXT["reclaim"])
    moved = 0
    removed: set[str] = set()
    for stream in keys.all_outboxes(len(state.depth)):
        while gone:
            reply = json.loads(text(reclaim(keys=[stream], args=[GROUP, RELEASED, BATCH, *gone])))
            moved += len(reply.get("e") or [])
            removed.update(reply.get("d") or [])
            if not reply.get("e"):
                break
    result = {"moved": moved, "removed_consumers": sorted(removed), "to": RELEASED}
    if args.json:
        print_json(result)
    else:
        print(
            f"moved {moved} entries held by {len(gone)} gone consumers to {RELEASED!r} "
            f"(a live instance takes them within seconds); removed {len(removed)} consumers "
            "from the group"
        )
    return 0


def as_json(state: OutboxState) -> dict[str, Any]:
    return {
        "depth": list(state.depth),
        "total": sum(state.depth),
        "oldest_age_s": state.oldest_age_s,
        "stranded": state.stranded,
        "released": state.released,
        "consumers": [
            {"name": c.name, "pending": c.pending, "alive": c.alive} for c in state.consumers
        ],
    }


def _verdict_json(verdict: Verdict) -> dict[str, str]:
    return {"check": verdict.check, "status": verdict.status.value, "detail": verdict.detail}


def render(state: OutboxState, verdict: Verdict) -> str:
    lines = ["shard depth: " + " ".join(f"{d}" for d in state.depth)]
    for c in state.consumers:
        mark = "alive" if c.alive else "GONE"
        lines.append(f"  consumer {c.name}: holds {c.pending} ({mark})")
    lines.append(verdict.line())
    if verdict.status is not Severity.OK and state.stranded:
        lines.append("  `outpost outbox release` hands them over now")
    return "\n".join(lines)
