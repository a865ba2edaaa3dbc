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
    ConnectionOptions,
    __version__,
    cluster_node_url,
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
    node = cluster_node_url(args.redis_url)
    if node is not None:
        cluster = redis.RedisCluster.from_url(
            node, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT
        )
        return cast(redis.Redis, cluster)
    return redis.Redis.from_url(
        args.redis_url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT
    )


def polar_client(args: argparse.Namespace) -> httpx.Client:
    headers = {"User-Agent": f"outpost-cli/{__version__}"}
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"
    return httpx.Client(base_url=args.server_url, headers=headers, timeout=TIMEOUT)


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def text_map(fields: Any) -> dict[str, str]:
    return {text(k): text(v) for k, v in (fields or {}).items()}


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def fail(command: str, message: str) -> int:
    print(f"outpost {command}: {message}", file=sys.stderr)
    return 2
