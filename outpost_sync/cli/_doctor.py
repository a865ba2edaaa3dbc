"""`outpost doctor`: check everything Outpost depends on, one verdict line each, and exit 1 when
one failed. Redis (reachable, version, mode, scripts, sharded pub/sub, Outpost's keys), Polar
(reachable, the token and its scopes, the WebSocket's configuration, the clock against Polar's),
and the outbox."""

from __future__ import annotations

import argparse
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import redis

from outpost_core import SCRIPT_SHA1, SCRIPT_TEXT, Link, LinkState, Target, keys, redact_url
from outpost_core.doctor import (
    Severity,
    Verdict,
    clock_skew,
    eviction_policy,
    outbox,
    overall,
    redis_version,
    shard_spread,
)
from outpost_io.tls import tls_context
from outpost_sync._backend import close_pubsub, open_pubsub, open_stream
from outpost_sync.cli import _outbox
from outpost_sync.cli import _shards as shards_command
from outpost_sync.cli._config import (
    TIMEOUT,
    add_connection_arguments,
    deployment_shards,
    polar_client,
    print_json,
    redis_client,
    response_detail,
    stored_shards,
)

KEY_SCAN_LIMIT = 100_000
"""Keys whose memory `doctor` adds up at most (a sample beyond that)."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "doctor",
        help="check Redis, Polar, the token, the clock and the outbox; exit 1 if one fails",
        description="Check everything Outpost depends on, with one verdict line each.",
    )
    add_connection_arguments(parser)
    parser.add_argument("--redis-version", help=argparse.SUPPRESS)  # a seam for tests
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    verdicts = redis_checks(args) + polar_checks(args)
    if args.json:
        print_json(
            {
                "verdicts": [
                    {"check": v.check, "status": v.status.value, "detail": v.detail}
                    for v in verdicts
                ],
                "ok": overall(verdicts) == 0,
            }
        )
    else:
        for verdict in verdicts:
            print(verdict.line())
    return overall(verdicts)


def _guarded(name: str, check: Callable[[], Verdict]) -> Verdict:
    try:
        return check()
    except (redis.RedisError, httpx.HTTPError, OSError, ValueError) as exc:
        return Verdict(name, Severity.FAIL, f"{type(exc).__name__}: {exc}")


# -- Redis ------------------------------------------------------------------------------------


def redis_checks(args: argparse.Namespace) -> list[Verdict]:
    client = redis_client(args)
    try:
        try:
            client.ping()
        except redis.RedisError as exc:
            shown = redact_url(args.redis_url)
            return [Verdict("redis", Severity.FAIL, f"{shown} unreachable: {exc}")]
        verdicts = [Verdict("redis", Severity.OK, f"{redact_url(args.redis_url)} answers")]
        info = client.info("server")
        verdicts.append(redis_version(args.redis_version or str(info.get("redis_version"))))
        for name, check in (
            ("redis mode", lambda: _mode(client)),
            ("eviction", lambda: _eviction(client)),
            ("scripts", lambda: _scripts(client)),
            ("sharded pub/sub", lambda: _pubsub(client)),
            ("keys", lambda: _keyspace(client)),
            ("shards", lambda: _shards(client)),
            ("outbox", lambda: outbox(_outbox.gather(client))),
        ):
            verdicts.append(_guarded(name, check))
        return verdicts
    finally:
        client.close()


def _mode(client: redis.Redis) -> Verdict:
    if isinstance(client, redis.RedisCluster):
        primaries = len(client.get_primaries())
        return Verdict("redis mode", Severity.OK, f"Redis Cluster, {primaries} primaries")
    if client.info("cluster").get("cluster_enabled") in (1, "1"):
        detail = (
            "this node belongs to a Redis Cluster, and the other nodes' keys answer MOVED here: "
            "give the SDK and this command redis+cluster://host:port"
        )
        return Verdict("redis mode", Severity.WARN, detail)
    return Verdict("redis mode", Severity.OK, "single Redis")


def _eviction(client: redis.Redis) -> Verdict:
    """INFO's view (CONFIG may be renamed on a managed Redis); the worst node of a cluster."""
    info: dict[str, Any] = client.info("memory")
    nodes = (
        list(info.values()) if info and all(isinstance(v, dict) for v in info.values()) else [info]
    )
    verdicts = [
        eviction_policy(str(node.get("maxmemory_policy")), int(node.get("maxmemory") or 0))
        for node in nodes
    ]
    order = [Severity.FAIL, Severity.WARN, Severity.OK]
    return min(verdicts, key=lambda v: order.index(v.status))


def _scripts(client: redis.Redis) -> Verdict:
    wrong = [
        name for name, body in SCRIPT_TEXT.items() if client.script_load(body) != SCRIPT_SHA1[name]
    ]
    if wrong:
        return Verdict("scripts", Severity.FAIL, f"SHA1 mismatch for {', '.join(wrong)}")
    return Verdict(
        "scripts", Severity.OK, f"{len(SCRIPT_TEXT)} scripts load ({', '.join(SCRIPT_TEXT)})"
    )


def _pubsub(client: redis.Redis) -> Verdict:
    channel = f"{keys.PREFIX}doctor:{uuid.uuid4().hex}"
    pubsub = open_pubsub(client)
    try:
        pubsub.ssubscribe(channel)
        deadline = time.monotonic() + TIMEOUT
        sent = False
        while time.monotonic() < deadline:
            message = pubsub.get_sharded_message(timeout=0.1)
            if message is None and not sent:
                continue
            if message is not None and message["type"] == "ssubscribe":
                started = time.perf_counter()
                client.spublish(channel, "ping")
                sent = True
            elif message is not None and message["type"] == "smessage":
                ms = (time.perf_counter() - started) * 1000
                return Verdict("sharded pub/sub", Severity.OK, f"round trip {ms:.1f} ms")
        return Verdict("sharded pub/sub", Severity.FAIL, f"no message back within {TIMEOUT:g} s")
    finally:
        close_pubsub(pubsub)


def _shards(client: redis.Redis) -> Verdict:
    stored = stored_shards(client)
    count = deployment_shards(client)
    spread = shards_command.spread(client, count)
    used, primaries = spread.get("primaries_used"), spread.get("primaries")
    return shard_spread(count, stored is not None, used, primaries)


def _keyspace(client: redis.Redis) -> Verdict:
    count = 0
    used = 0
    batch: list[Any] = []
    for key in client.scan_iter(match=f"{keys.PREFIX}*", count=1000):
        count += 1
        batch.append(key)
        if len(batch) == 1000:
            used += _memory(client, batch)
            batch = []
        if count >= KEY_SCAN_LIMIT:
            break
    used += _memory(client, batch)
    more = "+" if count >= KEY_SCAN_LIMIT else ""
    return Verdict("keys", Severity.OK, f"{count}{more} Outpost keys, {used / 1048576:.2f} MiB")


def _memory(client: redis.Redis, batch: list[Any]) -> int:
    pipe = client.pipeline(transaction=False)
    for key in batch:
        pipe.memory_usage(key)
    return sum(int(n or 0) for n in pipe.execute())


# -- Polar ------------------------------------------------------------------------------------


def polar_checks(args: argparse.Namespace) -> list[Verdict]:
    if not args.token:
        return [
            Verdict(
                "polar token",
                Severity.FAIL,
                "no access token (POLAR_ACCESS_TOKEN or --token): Polar not checked",
            )
        ]
    try:
        with polar_client(args) as http:
            response = http.get("/v1/meters/", params={"limit": 1})
            verdicts = [_token(args, response)]
            if response.status_code == 200:
                verdicts.append(_guarded("ingest scope", lambda: _ingest(http)))
            else:
                why = f"not checked: the token was refused (HTTP {response.status_code})"
                verdicts.append(Verdict("ingest scope", Severity.FAIL, why))
            verdicts.append(clock_skew(time.time_ns() // 1000, response.headers.get("date")))
    except httpx.HTTPError as exc:
        return [Verdict("polar", Severity.FAIL, f"{args.server_url} unreachable: {exc}")]
    verdicts.append(_guarded("websocket", lambda: _websocket(args)))
    return verdicts


def _token(args: argparse.Namespace, response: httpx.Response) -> Verdict:
    if response.status_code == 200:
        return Verdict("polar token", Severity.OK, f"{args.server_url} accepts the token")
    return Verdict(
        "polar token",
        Severity.FAIL,
        f"{args.server_url} answered HTTP {response.status_code}: {response_detail(response)}",
    )


def _ingest(http: httpx.Client) -> Verdict:
    response = http.post("/v1/events/ingest", json={"events": []})
    if response.status_code == 200:
        return Verdict("ingest scope", Severity.OK, "the token may ingest events")
    detail = f"ingestion answered HTTP {response.status_code}: {response_detail(response)}"
    if response.status_code in (401, 403):
        return Verdict("ingest scope", Severity.FAIL, f"{detail} (the token needs events:write)")
    # 429 or 5xx: Polar is busy or down; events wait in the outbox meanwhile.
    return Verdict("ingest scope", Severity.WARN, f"{detail} (delivery waits and retries)")


def _websocket(args: argparse.Namespace) -> Verdict:
    """Open the WebSocket with the SDK's own link and ask for the configuration."""
    target = Target.of(args.server_url)
    link = Link(target, args.token, random.Random())
    link.wants_connection(0.0)
    context = tls_context(True) if target.tls else None  # SSL_CERT_FILE, else certifi
    stream = open_stream(target.host, target.port, context, timeout=TIMEOUT)
    try:
        started = time.monotonic()
        link.opened(0.0)
        stream.send(link.data_to_send())
        asked = False
        while time.monotonic() - started < TIMEOUT:
            data = stream.receive(0.2)
            now = time.monotonic() - started
            messages = link.receive(data, now) if data is not None else []
            if link.state is not LinkState.OPEN and link.state is not LinkState.HANDSHAKING:
                reason = link.refused or link.last_error or "closed"
                return Verdict("websocket", Severity.FAIL, reason)
            if link.state is LinkState.OPEN and not asked:
                link.send({"type": "configuration"})
                asked = True
            out = link.data_to_send()
            if out:
                stream.send(out)
            for message in messages:
                if isinstance(message, dict) and message.get("type") == "configuration":
                    payload = message.get("payload") or {}
                    reducers = len(payload.get("reducers") or [])
                    return Verdict(
                        "websocket", Severity.OK, f"configuration received ({reducers} reducers)"
                    )
        return Verdict("websocket", Severity.FAIL, f"no configuration within {TIMEOUT:g} s")
    finally:
        link.close()
        stream.close()
