"""Fail-over: seconds from a SIGKILL to the delivery of everything the killed process held.

Each round a child process tracks events with an instance that reads them from the outbox but
never posts them (``tests/support/track_and_hang.py``: linger of an hour) and is killed with
SIGKILL. An instance with default settings starts at once and ``flush()`` times how long the
others take to find the dead instance (its heartbeat expires), take its entries and deliver them.
"""

from __future__ import annotations

import time

from bench._env import Env
from bench._stats import Figure, Side, Target
from outpost_sync import Outpost
from tests.support.track_and_hang import track_then_get_killed

TARGET = 30.0  # seconds from the crash to every event delivered (docs/design.md)
SETUP = (
    "Per round: a child process tracks {e} events (its instance holds them unposted), then gets "
    "SIGKILL; an instance with default settings (heartbeat 10 s) starts at once; time = from "
    "the kill until its flush() returns (every event delivered). Baseline: the {t:g} s target."
)


def _events(env: Env) -> tuple[int, int]:
    state = env.emulator.state()
    return state["events"]["count"], state["counters"].get("events_duplicate", 0)


def run(env: Env) -> list[Figure]:
    emu = env.emulator
    count = env.scale.failover_events
    seconds: list[float] = []
    delivered: list[int] = []
    duplicates: list[int] = []
    for _ in range(env.scale.failover_rounds):
        env.reset()
        before = _events(env)
        tracked = track_then_get_killed(env.url, emu.url, emu.token, count)
        killed = time.perf_counter()
        if tracked != count:
            raise RuntimeError(f"the child tracked {tracked} events, not {count}")
        survivor = Outpost(access_token=emu.token, server_url=emu.url, redis_url=env.url)
        try:
            if not survivor.flush(120):
                raise RuntimeError("the killed instance's events were not delivered in 120 s")
            seconds.append(time.perf_counter() - killed)
        finally:
            survivor.close()
        after = _events(env)
        delivered.append(after[0] - before[0])
        duplicates.append(after[1] - before[1])
    return [
        Figure(
            key="failover",
            title="fail-over: SIGKILL → all delivered",
            unit="s",
            subject=Side("kill → delivered", seconds),
            baseline=Side("target", [TARGET] * len(seconds)),
            ratios=[s / TARGET for s in seconds],
            ratio_meaning="seconds / the 30 s target per round (lower is better)",
            setup=SETUP.format(e=count, t=TARGET),
            target=Target("p99", "<=", TARGET),
            extra={"events": count, "delivered": delivered, "duplicates": duplicates},
        )
    ]
