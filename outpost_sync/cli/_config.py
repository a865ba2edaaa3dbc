"""What every operator command needs: the SDK's configuration (flags over environment over
defaults, as the SDK reads it), a Redis client, and an HTTP client for Polar's API."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, cast

import httpx
import redis

from outpost_core import (
    DEFAULT_REDIS_URL,
    DEFAULT_SERVER_URL,
    DEFAULT_SHARDS,
    SHARDS_KEY,
    ConfigurationError,
    ConnectionOptions,
    __version__,
    cluster_node_url,
    redact_url,
    shards,
)

TIMEOUT = 5.0


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    resolved = ConnectionOptions.resolve(os.environ)  # as the SDK resolves them
    parser.add_argument(
        "--redis-url",
        default=resolved.redis_url,
        help=f"the Redis the instances share (default: REDIS_URL, else {DEFAULT_REDIS_URL})",
    )
    parser.add_argument(
        "--server-url",
        default=resolved.server_url,
        help=f"Polar's API (default: POLAR_SERVER_URL, else {DEFAULT_SERVER_URL})",
    )
    parser.add_argument(
        "--token",
        default=resolved.access_token,
        help="organization access token (default: POLAR_ACCESS_TOKEN)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def redis_client(args: argparse.Namespace) -> redis.Redis:
    """One Redis, or a Redis Cluster for a ``redis+cluster://`` URL (as the SDK reads it): the
    commands run alike on both, each key on the node that owns its slot."""
    return redis_client_for(args.redis_url)


def redis_client_for(url: str) -> redis.Redis:
    node = cluster_node_url(url)
    if node is not None:
        cluster = redis.RedisCluster.from_url(
            node, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT
        )
        return cast(redis.Redis, cluster)
    return redis.Redis.from_url(url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT)


def stored_shards(client: redis.Redis) -> int | None:
    """The deployment's shard count as Redis stores it; ``None`` where none is stored yet (the
    instances that ran there, if any, used 16). :class:`ConfigurationError` when unreadable."""
    raw = client.get(SHARDS_KEY)
    if raw is None:
        return None
    count = shards.parse(raw)
    if count is None:
        raise ConfigurationError(
            f"the deployment's shard count at {SHARDS_KEY} is unreadable: "
            "`outpost shards set <count>` writes it again"
        )
    return count


def deployment_shards(client: redis.Redis) -> int:
    """How many shards the deployment's keys are spread over (16 where none is stored)."""
    count = stored_shards(client)
    return DEFAULT_SHARDS if count is None else count


def polar_client(args: argparse.Namespace) -> httpx.Client:
    headers = {"User-Agent": f"outpost-cli/{__version__}"}
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"
    return httpx.Client(base_url=args.server_url, headers=headers, timeout=TIMEOUT)


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def text_map(fields: Any) -> dict[str, str]:
    return {text(k): text(v) for k, v in (fields or {}).items()}


def redis_failure(args: argparse.Namespace, exc: redis.RedisError | ConfigurationError) -> str:
    """What a command says when its work in Redis failed: Redis's error, its URL without the
    password, or the deployment's configuration that does not hold."""
    if isinstance(exc, ConfigurationError):
        return str(exc)
    return f"Redis at {redact_url(args.redis_url)} failed: {exc}"


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def fail(command: str, message: str, args: argparse.Namespace | None = None) -> int:
    """Say why the command could not run (as JSON on stdout when it was asked for); exit 2."""
    if args is not None and getattr(args, "json", False):
        print_json({"command": command, "error": message})
    else:
        print(f"outpost {command}: {message}", file=sys.stderr)
    return 2


def response_detail(response: httpx.Response, limit: int = 200) -> str:
    """What an HTTP error response says: Polar's ``detail`` when the body is JSON carrying one,
    else the body's text; cut at a word, marked with an ellipsis, when longer than ``limit``."""
    said = response.text
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("detail"):
        detail = body["detail"]
        said = detail if isinstance(detail, str) else json.dumps(detail)
    said = " ".join(said.split())
    if len(said) <= limit:
        return said
    return said[:limit].rsplit(" ", 1)[0] + " …"
