"""A delivery loop reads the next batch while one is posted, and settles what Polar stored in
as few scripts as it can: a backlog goes in full batches, and a Redis failure of the read beside
a post loses nothing."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest

from outpost_core import (
    BatchAnswered,
    OutboxRead,
    PostAndSettle,
    PostBatch,
    PostedAlongside,
    ReadOutbox,
)
from outpost_core.traces import replay_delivery
from outpost_emulator import Emulator
from tests.drivers._async._helpers import connect, count_meter
from tests.support.redis_server import RedisServer
from tests.support.refusing_port import RefusingPort

EVENTS = 61


def actions_of(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every effect a recorded delivery loop drained, in order."""
    return [e for r in trace if r.get("t") == "effects" for e in r["effects"]]


def posts_of(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The posts a recorded delivery loop made, with what each carried."""
    return [a for a in actions_of(trace) if a["$kind"] in ("PostBatch", "PostAndSettle")]


def size_of(post: dict[str, Any]) -> int:
    return int((post["post"] if post["$kind"] == "PostAndSettle" else post)["size"])


def ingest_requests(emulator: Emulator) -> int:
    return int(emulator.state()["counters"].get("http_ingest", 0))


def recorded(directory: Path) -> list[dict[str, Any]]:
    text = (directory / "delivery-0.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.anyio
async def test_a_backlog_goes_in_full_batches_each_read_while_the_last_is_posted(
    redis_server: RedisServer, emulator: Emulator, tmp_path: Path
) -> None:
    count_meter(emulator)
    emulator.fault_ingest_hang(0.5)  # the first post waits: what is tracked meanwhile queues up
    async with connect(redis_server, emulator, batch_size=10, record_to=tmp_path) as a:
        for n in range(EVENTS):
            await a.track("api_call", external_customer_id=f"c{n % 12}")
        assert await a.flush(20)
    trace = recorded(tmp_path)
    assert replay_delivery(trace, random.Random) == []
    sizes = [size_of(post) for post in posts_of(trace)]
    assert sum(sizes) == EVENTS
    assert all(size == 10 for size in sizes[1:-1]), sizes  # no request spent on a part
    assert any(post.get("read") for post in posts_of(trace))
    # Batches that followed each other settled together: fewer scripts than batches.
    settles = [action for action in actions_of(trace) if action.get("settles")]
    scripts = sum(len(action["settles"]) for action in settles)
    streams = {key for post in settles for s in post["settles"] for key in s["keys"][:1]}
    assert scripts < len(sizes) * len(streams)


@pytest.mark.anyio
async def test_a_read_beside_a_post_that_redis_refuses_finds_nothing_and_is_counted(
    redis_server: RedisServer, emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    meter = count_meter(emulator)
    event = {"name": "api_call", "external_customer_id": "c1", "external_id": "e1"}
    body = json.dumps({"events": [event]}).encode()
    action = PostAndSettle(PostBatch(body, 1), (), ReadOutbox(count=10, block=0.0))
    async with connect(redis_server, emulator) as a:
        await a.track("api_call", external_customer_id="c0")  # started, its groups made
        assert await a.flush(10)
        deliveries = a._delivery
        with caplog.at_level(logging.WARNING, logger="outpost"):
            redis_server.stop()
            with RefusingPort(redis_server.port):
                outcome = await deliveries._act(7, action)  # a loop number none runs
            redis_server.start()
        # The post went, and its answer came back; the read found nothing (what it may have
        # taken is read again later: the failure counts as the loop's, logged by its outage).
        assert isinstance(outcome, PostedAlongside)
        assert isinstance(outcome.answer, BatchAnswered) and outcome.answer.status == 200
        assert outcome.read == OutboxRead([])
    assert emulator.customer_meter(meter, external_customer_id="c1")["consumed_units"] == 1
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("Redis unreachable for delivery 7" in m for m in warned), warned
