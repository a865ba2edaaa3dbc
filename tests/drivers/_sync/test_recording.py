# GENERATED from tests/drivers/_async/test_recording.py by scripts/unasync.py: do not edit.
"""The opt-in trace recorder (conformance): a run of either driver replays exactly through a
fresh core."""

from __future__ import annotations

import json
import random
from pathlib import Path

from outpost_core._trace import replay_delivery, replay_session
from outpost_emulator import Emulator
from tests.drivers._sync._helpers import connect, count_meter, eventually
from tests.support.redis_server import RedisServer


def test_a_recorded_run_replays_exactly(
    redis_server: RedisServer, emulator: Emulator, tmp_path: Path
) -> None:
    meter = count_meter(emulator)
    emulator.grant_credits(meter, 100, external_customer_id="c1")
    with connect(redis_server, emulator, record_to=tmp_path) as a:
        for _ in range(5):
            a.track("api_call", external_customer_id="c1")
        a.balance(meter, external_customer_id="c1")
        assert a.flush(10)
        emulator.advance(6 * 60)

        def counted() -> bool:
            return (a.balance(meter, external_customer_id="c1")).pending == 0

        eventually(counted, what="the snapshot counting the events")
    session = [json.loads(line) for line in (tmp_path / "session.jsonl").read_text().splitlines()]
    delivery = [json.loads(x) for x in (tmp_path / "delivery-0.jsonl").read_text().splitlines()]
    kinds = {record.get("t") for record in session[1:]}
    assert {"input", "effects", "call"} <= kinds
    assert replay_session(session, random.Random) == []
    assert replay_delivery(delivery, random.Random) == []
    text = (tmp_path / "session.jsonl").read_text()
    assert emulator.token not in text  # the token is redacted from recorded handshakes
