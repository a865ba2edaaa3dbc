"""Record the checked-in conformance traces from real runs (emulator + redis-server).

    python -m conformance.record_traces            # every scenario, into conformance/traces/
    python -m conformance.record_traces reconnect  # one scenario

Each scenario drives sync ``Outpost`` instances with ``record_to=``, so each trace is what a
real driver fed its core. Re-recording is this script, never a hand edit: the traces' event ids,
times and seeds change with every recording, and the replay test only asks that each trace
replays through a fresh core with no mismatch.
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from outpost_core import Customer
from outpost_core import _keys as keys
from outpost_emulator import Emulator
from outpost_sync import NotReady, Outpost
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

TRACES = Path(__file__).resolve().parent / "traces"
CALLS = {"conjunction": "and", "clauses": [{"property": "name", "operator": "eq", "value": "a"}]}


class Run:
    """One scenario: a Redis, an emulator with a count meter, and instances that record."""

    def __init__(self, name: str, redis: RedisServer, emulator: Emulator) -> None:
        self.directory = TRACES / name
        self.redis = redis
        self.emulator = emulator
        self.meter = str(emulator.create_meter("calls", CALLS, {"func": "count"})["id"])
        self.customer = f"c-{uuid.uuid4().hex[:6]}"

    def instance(self, label: str, **options: Any) -> Outpost:
        options.setdefault("linger", 0.02)
        options.setdefault("retry_base", 0.05)
        return Outpost(
            access_token=self.emulator.token,
            server_url=self.emulator.url,
            redis_url=self.redis.url,
            clock=self.emulator.clock,
            telemetry=False,
            record_to=self.directory / label,
            **options,
        )

    def balance(self, outpost: Outpost) -> Any:
        return outpost.balance(self.meter, external_customer_id=self.customer)

    def track(self, outpost: Outpost, n: int = 1, name: str = "a") -> list[str]:
        return [outpost.track(name, external_customer_id=self.customer) for _ in range(n)]


def first_read_and_not_ready(run: Run) -> None:
    """A first read that times out (Polar is slow), then one that gets its snapshot."""
    with run.instance("a", snapshot_timeout=0.3) as a:
        wait_until(lambda: a.connected, "the WebSocket opening")
        run.emulator.fault_snapshot_delay(0.6)
        try:
            run.balance(a)
        except NotReady:
            pass
        else:
            raise RuntimeError("the first read should have timed out")
        run.emulator.fault_snapshot_delay(0)
        wait_until(lambda: _ready(run, a), "the delayed snapshot")


def _ready(run: Run, outpost: Outpost) -> bool:
    try:
        run.balance(outpost)
    except NotReady:
        return False
    return True


def pushed_snapshot(run: Run) -> None:
    """A credit grant on Polar's side reaches a warm customer through a pushed snapshot."""
    run.emulator.grant_credits(run.meter, 10, external_customer_id=run.customer)
    with run.instance("a") as a:
        assert run.balance(a).credited == 10
        run.emulator.grant_credits(run.meter, 5, external_customer_id=run.customer)
        wait_until(lambda: run.balance(a).credited == 15, "the pushed snapshot")


def acknowledge_hot_and_cold(run: Run) -> None:
    """Events acknowledged while their bucket is hot, then events acknowledged after a snapshot
    made their bucket cold (Polar could not take them in time)."""
    with run.instance("a", max_attempts=1000) as a:
        run.balance(a)
        run.track(a, 2)
        assert a.flush(10)  # acknowledged, bucket hot
        run.emulator.fault_ingest_error(503, count=10_000)
        run.track(a, 2)
        run.emulator.advance(6 * 60)  # the bucket syncs without the last two: now it is cold
        run.emulator.grant_credits(run.meter, 1, external_customer_id=run.customer)
        wait_until(lambda: run.balance(a).credited == 1, "a snapshot making the bucket cold")
        run.emulator.fault_clear()
        assert a.flush(10)  # acknowledged, bucket cold
        wait_until(lambda: run.balance(a).pending == 0, "Polar counting every event")


def dropped_batch(run: Run) -> None:
    """Polar fails every delivery: after max_attempts the batch is reported and acknowledged (a
    5xx may come after Polar stored it, so its events keep counting)."""
    dropped: list[Any] = []
    run.emulator.fault_ingest_error(500, count=10_000)
    with run.instance("a", max_attempts=2, on_dropped=lambda e, r: dropped.extend(e)) as a:
        run.balance(a)
        run.track(a, 3)
        assert a.flush(10)
        wait_until(lambda: len(dropped) == 3 and run.balance(a).undelivered == 0, "the drop")
        assert run.balance(a).pending == 3
        run.emulator.fault_clear()


def reconnect(run: Run) -> None:
    """Polar drops every WebSocket; the instance reconnects and asks for its customers again."""
    run.emulator.grant_credits(run.meter, 3, external_customer_id=run.customer)
    with run.instance("a") as a:
        run.balance(a)
        run.emulator.fault_drop_websockets()
        wait_until(lambda: _subscribed_again(run), "the new connection asking again")
        run.emulator.grant_credits(run.meter, 4, external_customer_id=run.customer)
        wait_until(lambda: run.balance(a).credited == 7, "a push on the new connection")


def _subscribed_again(run: Run) -> bool:
    return any(c.get("subscriptions") for c in run.emulator.state()["connections"])


def revision_gap_reload(run: Run) -> None:
    """Instance b misses a change (a write that bypassed the channel), sees the gap on the next
    one, and reloads."""
    with run.instance("a") as a, run.instance("b") as b:
        run.balance(a)
        assert run.balance(b).consumed == 0
        state_key = next(m.key for m in b._context.session.followed)
        raw = run.redis.client()
        raw.hset(state_key, "a:0", "5 5 1 1")
        raw.hincrby(state_key, "rev", 1)
        run.track(a)
        wait_until(lambda: run.balance(b).consumed == 6, "b reloading after the gap")


def forged_changes(run: Run) -> None:
    """Changes no script publishes, on the shard channel: a "full" that is true and deleted fields
    that are null are refused; one at the next revision holding an unreadable aggregate is
    refused and the copy reloads the hash. The balance counts the event throughout."""
    with run.instance("a") as a:
        run.track(a)
        assert run.balance(a).consumed == 1
        wait_until(lambda: a.subscribed, "the subscription")
        state_key = next(m.key for m in a._context.session.followed)
        raw = run.redis.client()
        rev = int(raw.hget(state_key, "rev") or 0)
        names = [n.decode() for n in raw.hkeys(state_key)]  # type: ignore[union-attr]
        bucket = next(n for n in names if n.startswith("a:"))
        channel = keys.channel(keys.shard_of(Customer("external", run.customer)))
        forged: list[dict[str, Any]] = [
            {"s": ["rev", str(rev + 1), "p", "0 0 - -"], "full": True},
            {"s": [bucket, "0 0 - -"], "d": None},
            {"s": [bucket, "x y z"]},
        ]
        for count, change in enumerate(forged, 1):
            raw.spublish(channel, json.dumps({"c": [{"k": state_key, "r": rev + 1, **change}]}))

            def counted(n: int = count) -> bool:
                return a.rejections.get("change", 0) == n

            wait_until(counted, "the change counted")
            assert run.balance(a).consumed == 1
        run.track(a)
        assert run.balance(a).consumed == 2


def split_422(run: Run) -> None:
    """One event Polar refuses (an unknown customer id) does not sink its batch."""
    dropped: list[Any] = []
    with run.instance("a", linger=30.0, on_dropped=lambda e, r: dropped.extend(e)) as a:
        run.balance(a)
        run.track(a, 2)
        a.track("a", customer_id=str(uuid.uuid4()))
        run.track(a, 2)
        assert a.flush(10)
        wait_until(lambda: len(dropped) == 1, "the refused event reported")


SCENARIOS: dict[str, Callable[[Run], None]] = {
    f.__name__: f
    for f in (
        first_read_and_not_ready,
        pushed_snapshot,
        acknowledge_hot_and_cold,
        dropped_batch,
        reconnect,
        revision_gap_reload,
        split_422,
        forged_changes,
    )
}


@contextmanager
def peers() -> Iterator[tuple[RedisServer, Emulator]]:
    redis = RedisServer()
    redis.start()
    try:
        with Emulator.start(port=0, sync_delay=1.0) as emulator:
            yield redis, emulator
    finally:
        redis.close()


def record(name: str) -> None:
    shutil.rmtree(TRACES / name, ignore_errors=True)
    with peers() as (redis, emulator):
        SCENARIOS[name](Run(name, redis, emulator))


def main(argv: list[str]) -> int:
    names = argv or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        sys.stderr.write(f"unknown scenarios {unknown}; known: {list(SCENARIOS)}\n")
        return 2
    for name in names:
        record(name)
        sys.stdout.write(f"recorded {name}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
