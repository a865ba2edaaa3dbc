"""The opt-in trace recorder (conformance): a run of either driver replays exactly through a
fresh core."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from outpost_core.traces import replay_delivery, replay_session
from outpost_emulator import Emulator
from tests.drivers._async._helpers import connect, count_meter, eventually
from tests.support.redis_server import RedisServer


@pytest.mark.anyio
async def test_a_recorded_run_replays_exactly(
    redis_server: RedisServer, emulator: Emulator, tmp_path: Path
) -> None:
    meter = count_meter(emulator)
    emulator.grant_credits(meter, 100, external_customer_id="c1")
    async with connect(redis_server, emulator, record_to=tmp_path) as a:
        for _ in range(5):
            await a.track("api_call", external_customer_id="c1")
        await a.balance(meter, external_customer_id="c1")
        assert await a.flush(10)
        emulator.advance(6 * 60)

        async def counted() -> bool:
            return (await a.balance(meter, external_customer_id="c1")).pending == 0

        await eventually(counted, what="the snapshot counting the events")
    session = [json.loads(line) for line in (tmp_path / "session.jsonl").read_text().splitlines()]
    delivery = [json.loads(x) for x in (tmp_path / "delivery-0.jsonl").read_text().splitlines()]
    kinds = {record.get("t") for record in session[1:]}
    assert {"input", "effects", "call"} <= kinds
    assert replay_session(session, random.Random) == []
    assert replay_delivery(delivery, random.Random) == []
    text = (tmp_path / "session.jsonl").read_text()
    assert emulator.token not in text  # the token is redacted from recorded handshakes
