"""Run one Lua vector against a real Redis, and the normal form its results are compared in.

A vector (``conformance/lua/<script>.jsonl``, see ``conformance/README.md``) gives the Redis state
before, the script's KEYS and ARGV, and what the script must produce: its reply, the state after,
and the messages it published. :func:`execute` loads the state before into an empty database, runs
the composed script with EVALSHA, and returns what came out in the same normal form:

* replies and published messages are parsed JSON (a reply that comes as the pair
  ``[published text, reply]`` is the list of both, each parsed); each change's ``s`` becomes a
  list of ``[field, value]`` pairs sorted by field, its ``d`` a sorted list (Lua's cjson writes
  an empty list as ``{}``; both read as ``[]``), so the order in which Lua iterates a table never
  matters;
* stream entry ids a script creates (``XADD *``) become ``<new:1>``, ``<new:2>``… in stream order;
  ids present before keep their value;
* a key's time to live is ``"set"`` or ``"none"``, never a number of seconds;
* a revision drawn from Redis's clock (a new identity's first, 10^12 or more) is ``<fresh>``.

Both the recorder and the replay test use this module; the TypeScript SDK implements the same few
steps from the README.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

import redis

from outpost_core import keys

SCHEMA = "outpost-lua-vectors/1"
SCRIPTS = (
    "track",
    "acknowledge",
    "confirm",
    "apply_snapshot",
    "reclaim",
    "budget",
    "reserve",
    "release",
    "admit",
    "apply_anchor",
)
"""The scripts that have vectors, one file each (``conformance/lua/<script>.jsonl``), in the
order they are recorded."""
SENTINEL = "outpost:conformance:sentinel"
"""A channel the runner publishes on after the script: every message before it is the script's."""

Json = Any


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


# -- the state before ---------------------------------------------------------------------------


def load(client: redis.Redis, before: Mapping[str, Json]) -> None:
    """Empty the database, then write ``before``: hashes, sorted sets (member → score), then
    streams with their groups."""
    client.flushall()
    for key, fields in before.get("hashes", {}).items():
        if fields:
            client.hset(key, mapping=fields)
    for key, members in before.get("zsets", {}).items():
        if members:
            client.zadd(key, {member: float(score) for member, score in members.items()})
    for key, stream in before.get("streams", {}).items():
        for entry in stream.get("entries", []):
            client.xadd(key, entry["fields"], id=entry["id"])
        for group, spec in stream.get("groups", {}).items():
            client.xgroup_create(key, group, id="0", mkstream=True)
            for consumer, ids in spec.get("pending", {}).items():
                if not ids:
                    continue
                read = cast(Any, client.xreadgroup(group, consumer, {key: ">"}, count=len(ids)))
                got = [_text(entry_id) for _, entries in read for entry_id, _ in entries]
                if got != list(ids):
                    raise ValueError(
                        f"{key}: pending ids of {consumer} must be the next entries in order, "
                        f"got {got} for {ids}"
                    )


# -- running ------------------------------------------------------------------------------------


def subscribe(client: redis.Redis) -> redis.client.PubSub:
    """A connection following every shard's channel and the sentinel (SSUBSCRIBE)."""
    pubsub: redis.client.PubSub = client.pubsub()  # type: ignore[no-untyped-call,unused-ignore]
    pubsub.ssubscribe(*keys.all_channels(), SENTINEL)
    confirmed = 0
    while confirmed < len(keys.all_channels()) + 1:
        message = pubsub.get_message(timeout=5.0)
        if message is None:
            raise RuntimeError("SSUBSCRIBE was not confirmed")
        if message["type"] == "ssubscribe":
            confirmed += 1
    return pubsub


def drain(client: redis.Redis, pubsub: redis.client.PubSub) -> list[tuple[str, str]]:
    """Every message published before now, as (channel, data), in order."""
    client.spublish(SENTINEL, "end")
    out: list[tuple[str, str]] = []
    while True:
        message = pubsub.get_message(timeout=5.0)
        if message is None:
            raise RuntimeError("the sentinel message did not arrive")
        if message["type"] != "smessage":
            continue
        channel = _text(message["channel"])
        if channel == SENTINEL:
            return out
        out.append((channel, _text(message["data"])))


def execute(
    client: redis.Redis,
    pubsub: redis.client.PubSub,
    text: str,
    before: Mapping[str, Json],
    keys: Sequence[str],
    argv: Sequence[str],
) -> dict[str, Json]:
    """Load ``before``, run the script ``text`` once, return reply, after and published."""
    load(client, before)
    drain(client, pubsub)
    sha = _text(client.script_load(text))
    raw = client.evalsha(sha, len(keys), *keys, *argv)
    published = drain(client, pubsub)
    return {
        "reply": normal_reply(raw),
        "after": dump(client, before),
        "published": [
            {"channel": channel, "message": normal_changes(json.loads(data))}
            for channel, data in published
        ],
    }


# -- the normal form ----------------------------------------------------------------------------


def normal_reply(raw: object) -> Json:
    """A script's reply in normal form: a pair ``[published text, reply]`` as the list of both."""
    if isinstance(raw, list):
        return [normal_changes(json.loads(_text(part))) for part in raw]
    return normal_changes(json.loads(_text(raw)))


def _list(value: Json) -> list[Json]:
    if isinstance(value, dict) and not value:
        return []  # Lua's cjson writes an empty table as {}
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {value!r}")
    return value


FRESH = 10**12
"""Revisions from here up come from Redis's clock: a hash that did not exist starts there."""


def fresh(revision: Json) -> Json:
    """A clock-based revision (a new identity's first) reads ``<fresh>``; others as they are."""
    try:
        return "<fresh>" if int(revision) >= FRESH else revision
    except (TypeError, ValueError):
        return revision


def normal_changes(obj: Json) -> Json:
    """A script's reply or message, in normal form (sorted ``s`` pairs and ``d`` names)."""
    if not isinstance(obj, dict) or "c" not in obj:
        return obj
    changes: list[Json] = []
    for change in _list(obj["c"]):
        out: dict[str, Json] = {"k": change["k"], "r": fresh(change["r"])}
        if "s" in change:
            flat = _list(change["s"])
            out["s"] = sorted(
                [name, fresh(value) if name == "rev" else value]
                for name, value in zip(flat[::2], flat[1::2], strict=True)
            )
        if "d" in change:
            out["d"] = sorted(_list(change["d"]))
        if "full" in change:
            out["full"] = change["full"]
        changes.append(out)
    return {**obj, "c": changes}


def dump(client: redis.Redis, before: Mapping[str, Json]) -> dict[str, Json]:
    """The whole database in normal form; stream ids absent from ``before`` become placeholders."""
    known = {
        entry["id"]
        for stream in before.get("streams", {}).values()
        for entry in stream.get("entries", [])
    }
    hashes: dict[str, dict[str, str]] = {}
    zsets: dict[str, dict[str, str]] = {}
    streams: dict[str, Json] = {}
    ttl: dict[str, str] = {}
    for raw_key in sorted(client.scan_iter(count=1000)):
        key = _text(raw_key)
        kind = _text(client.type(key))
        ttl[key] = "set" if client.ttl(key) >= 0 else "none"
        if kind == "hash":
            fields = {_text(f): _text(v) for f, v in sorted(client.hgetall(key).items())}
            if "rev" in fields:
                fields["rev"] = fresh(fields["rev"])
            hashes[key] = fields
        elif kind == "zset":
            # Scores as Redis writes them (integral µs here: no exponent, no point).
            pairs = client.zrange(key, 0, -1, withscores=True, score_cast_func=_text)
            zsets[key] = {_text(m): _text(score) for m, score in cast(Any, pairs)}
        elif kind == "stream":
            streams[key] = _dump_stream(client, key, known)
        else:
            raise ValueError(f"unexpected {kind} key {key!r}")
    return {"hashes": hashes, "zsets": zsets, "streams": streams, "ttl": ttl}


def _dump_stream(client: redis.Redis, key: str, known: set[str]) -> Json:
    names: dict[str, str] = {}

    def name(entry_id: object) -> str:
        text = _text(entry_id)
        if text in known:
            return text
        if text not in names:
            names[text] = f"<new:{len(names) + 1}>"
        return names[text]

    entries = [
        {"id": name(entry_id), "fields": {_text(f): _text(v) for f, v in fields.items()}}
        for entry_id, fields in cast(Any, client.xrange(key))
    ]
    groups: dict[str, Json] = {}
    for info in cast(Any, client.xinfo_groups(key)):
        group = _text(info["name"])
        pending: dict[str, list[str]] = {}
        for item in client.xpending_range(key, group, "-", "+", 10_000):
            pending.setdefault(_text(item["consumer"]), []).append(name(item["message_id"]))
        groups[group] = {"pending": pending}
    return {"entries": entries, "groups": groups}
