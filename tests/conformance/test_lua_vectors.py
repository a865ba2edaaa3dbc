"""Replay the Lua vectors of ``conformance/lua/`` against a real redis-server.

Each vector loads the state before into an empty database, runs the composed script (lib.lua and
the script, by EVALSHA) with the recorded KEYS and ARGV, and compares the reply, the whole
database after, and the messages published on the shard channels. A failure here means a script
no longer does what the vectors (shared with the TypeScript SDK) say: re-record them with
``python -m conformance.record_lua_vectors`` only if the change is intended.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from conformance.lua_vectors import SCHEMA, SCRIPTS, execute, subscribe
from outpost_core import SCRIPT_SHA1, SCRIPT_TEXT
from tests.support.redis_server import RedisServer

VECTORS = Path(__file__).resolve().parents[2] / "conformance" / "lua"


def read(script: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = (VECTORS / f"{script}.jsonl").read_text(encoding="utf-8").splitlines()
    header, *cases = (json.loads(line) for line in lines)
    return header, cases


def all_cases() -> Iterator[Any]:
    for script in SCRIPTS:
        _, cases = read(script)
        for case in cases:
            yield pytest.param(script, case, id=f"{script}/{case['name']}")


@pytest.fixture
def client(redis_server: RedisServer) -> redis.Redis:
    return redis_server.client()


@pytest.mark.parametrize(("script", "case"), list(all_cases()))
def test_vector(client: redis.Redis, script: str, case: dict[str, Any]) -> None:
    pubsub = subscribe(client)
    try:
        got = execute(
            client, pubsub, SCRIPT_TEXT[script], case["before"], case["keys"], case["argv"]
        )
    finally:
        pubsub.close()
    assert got["reply"] == case["reply"], case["description"]
    assert got["after"] == case["after"], case["description"]
    assert got["published"] == case["published"], case["description"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_vectors_were_recorded_with_the_current_script(script: str) -> None:
    header, cases = read(script)
    assert header["schema"] == SCHEMA
    assert header["script"] == script
    assert header["sha1"] == SCRIPT_SHA1[script], (
        f"lua/{script}.lua changed since its vectors were recorded: replay passed or not, run "
        "python -m conformance.record_lua_vectors and review the diff"
    )
    assert len(cases) >= 5
    assert len({case["name"] for case in cases}) == len(cases)


def test_every_script_has_vectors() -> None:
    assert set(SCRIPT_TEXT) == set(SCRIPTS)
