"""Where a sync ``track()`` spends its time: ``python -m bench.decompose [--rounds N] [--ops N]``.

Not part of ``python -m bench``: a diagnostic for the track() figures. It starts its own Redis,
stores a configuration and applies a snapshot (no Polar, as the track benchmark does), then
measures in interleaved rounds, each step's median per call:

1. EVALSHA of ``return 1`` with no keys (the benchmark's baseline);
2. the same trivial script with the KEYS/ARGV of a real track (what sending them costs);
3. the real track script, bare (KEYS/ARGV precomputed, reply not parsed);
4. the core alone: ``Session.track()`` building the script call (uuid, validation, JSON, keys);
5. the core alone: ``Session.handle(ScriptReplied(reply))`` applying a track's reply;
6. steps 4, the script call (``EVALSHA`` on the client, as step 3), 5 in a row, in this thread,
   on a session that follows the identity, without the driver (track() with no background thread
   and no lock); 4, 5 and the script call are timed inside this loop;
7. ``Outpost.track()`` on an instance whose tracks publish where no one listens (another
   namespace's channels): no echo, in Redis or in the instance (a diagnostic patch);
8. ``Outpost.track()`` as shipped.

Redis's own time per call (INFO commandstats) is shown for the steps that run a script, and
last, steps 7 and 8 over step 3 taken round by round (the target is on step 8 over step 3).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import attrs
import redis

from bench import track as track_bench
from bench._offline import CONFIGURATION, METER, prepare
from outpost_core import (
    SCRIPT_SHA1,
    SCRIPT_TEXT,
    ConfigurationReceived,
    IdentityLoaded,
    LoadIdentity,
    RunScript,
    ScriptReplied,
    Session,
    SubscriberRestarted,
)
from outpost_emulator.redis_server import running
from outpost_sync import Outpost

CUSTOMER = track_bench.CUSTOMER
RAW = track_bench.RAW_CUSTOMER


def _server_us(client: redis.Redis) -> float:
    stats: dict[str, Any] = client.info("commandstats")
    return float(stats.get("cmdstat_evalsha", {}).get("usec_per_call", 0.0))


def _timed(call: Callable[[], Any], ops: int) -> float:
    pc = time.perf_counter_ns
    out = [0] * ops
    gc.collect()
    for i in range(ops):
        t0 = pc()
        call()
        out[i] = pc() - t0
    return statistics.median(out) / 1000.0


class _Driverless:
    """The core driven in this thread as the driver would, minus threads, locks and pub/sub."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.session = Session()
        self.session.handle(ConfigurationReceived(CONFIGURATION, from_cache=True))
        self.session.handle(SubscriberRestarted())  # as the driver's subscriber does at start
        self.sha = SCRIPT_SHA1["track"]
        while self.session.read(METER, external_customer_id=RAW) is None:
            for effect in self.session.effects():
                assert isinstance(effect, LoadIdentity)
                fields = client.hgetall(effect.key)
                self.session.handle(IdentityLoaded(effect.key, fields, effect.load_id))

    def build(self) -> RunScript:
        now = time.time_ns() // 1000
        return self.session.track(
            name="api_call",
            external_customer_id=RAW,
            metadata=None,
            timestamp_us=now,
            now_us=now,
            event_id=uuid.uuid4().hex,
        )

    def run(self, run: RunScript) -> Any:
        return self.client.evalsha(self.sha, len(run.keys), *run.keys, *run.args)

    def apply(self, reply: Any) -> None:
        self.session.handle(ScriptReplied(reply))
        self.session.effects()

    def track(self) -> None:
        self.apply(self.run(self.build()))

    def parts(self, ops: int) -> tuple[float, float, float, float]:
        """Median µs of building, running, applying, and of the three in a row."""
        pc = time.perf_counter_ns
        build, run, apply, total = [0] * ops, [0] * ops, [0] * ops, [0] * ops
        gc.collect()
        for i in range(ops):
            t0 = pc()
            call = self.build()
            t1 = pc()
            reply = self.run(call)
            t2 = pc()
            self.apply(reply)
            t3 = pc()
            build[i], run[i], apply[i], total[i] = t1 - t0, t2 - t1, t3 - t2, t3 - t0
        return tuple(statistics.median(x) / 1000.0 for x in (build, run, apply, total))  # type: ignore[return-value]


def _precomputed(client: redis.Redis, sha: str, count: int) -> Callable[[], Any]:
    """EVALSHA of ``sha`` with the KEYS/ARGV of the next of ``count`` precomputed tracks (built
    by a session that follows no identity, as several tracks ahead cannot know revisions)."""
    runs = iter(list(track_bench._raw_runs(count)))

    def call() -> Any:
        run = next(runs)
        return client.evalsha(sha, len(run.keys), *run.keys, *run.args)

    return call


def _deafen(instance: Outpost, namespace: str) -> None:
    """Once subscribed: the instance's tracks publish on ``namespace``'s channels, which no one
    hears (its subscription stays on the usual ones): no echo to read, here or in Redis."""
    session = instance._context.session
    session.settings = attrs.evolve(session.settings, channel_namespace=namespace)


def _tracker(instance: Outpost) -> Callable[[], Any]:
    call = instance.track
    return lambda: call("api_call", external_customer_id=CUSTOMER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decompose", description=__doc__)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--ops", type=int, default=1000)
    args = parser.parse_args(argv)
    steps: dict[str, list[float]] = {}
    server: dict[str, list[float]] = {}

    def record(name: str, value: float, client: redis.Redis | None = None) -> None:
        steps.setdefault(name, []).append(value)
        if client is not None:
            server.setdefault(name, []).append(_server_us(client))

    with running() as srv:
        client = redis.Redis.from_url(srv.url, health_check_interval=10)
        prepare(client, CUSTOMER, RAW)
        trivial = str(client.script_load("return 1"))
        client.script_load(SCRIPT_TEXT["track"])
        driverless = _Driverless(client)
        ops = args.ops
        for _ in range(args.rounds):
            client.config_resetstat()
            record("1 EVALSHA return 1", _timed(lambda: client.evalsha(trivial, 0), ops), client)
            client.config_resetstat()
            padded = _precomputed(client, trivial, ops)
            record("2 EVALSHA return 1, track's KEYS/ARGV", _timed(padded, ops), client)
            client.config_resetstat()
            bare = _precomputed(client, SCRIPT_SHA1["track"], ops)
            record("3 EVALSHA track.lua, bare", _timed(bare, ops), client)
            client.config_resetstat()
            build, run, apply, total = driverless.parts(ops)
            record("4 core: Session.track() builds the call", build)
            record("5 core: handle(ScriptReplied)", apply)
            record("6 core + Redis in one thread, no driver", total, client)
            steps.setdefault("  of which the script call", []).append(run)
            for name, namespace in (
                ("7 Outpost.track(), hearing no echo", "decompose-deaf"),
                ("8 Outpost.track() as shipped", None),
            ):
                with Outpost(redis=client, telemetry=False) as instance:
                    instance.balance(METER, external_customer_id=CUSTOMER)
                    if namespace is not None:
                        _deafen(instance, namespace)
                    client.config_resetstat()
                    record(name, _timed(_tracker(instance), ops), client)
        client.close()

    base = statistics.median(steps["1 EVALSHA return 1"])
    width = max(len(name) for name in steps)
    print(f"{'step'.ljust(width)}  p50 µs  × step 1  Redis µs/call")
    for name, values in steps.items():
        p50 = statistics.median(values)
        own = f"{statistics.median(server[name]):13.1f}" if name in server else ""
        print(f"{name.ljust(width)}  {p50:6.1f}  {p50 / base:7.2f}  {own}")
    # The figure the target is on, round by round: both sides of a ratio ran a few milliseconds
    # apart, so a machine that slows down for a while slows both (the medians above do not pair).
    bare_script = steps["3 EVALSHA track.lua, bare"]
    for name in ("7 Outpost.track(), hearing no echo", "8 Outpost.track() as shipped"):
        ratios = sorted(a / b for a, b in zip(steps[name], bare_script, strict=True))
        middle, spread = statistics.median(ratios), f"{ratios[0]:.2f}-{ratios[-1]:.2f}"
        print(f"step {name[0]} / step 3, per round: median {middle:.2f} ({spread})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
