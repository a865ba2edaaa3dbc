"""A million customers read by one process: one sync instance, real Redis, ``max_customers`` at its
default, reads 1,000,000 distinct customers' balances once each (every read a first read). Its
RSS growth stays under 100 MB, and the cold-read rate over the last tenth is at least 0.8× the
rate over the first tenth (``_million_child`` reads; this module seeds Redis and builds the rows).

Redis holds every customer's state hash before the run, written here by one pipeline of scripts
(the fields ``apply_snapshot`` writes, copied from one customer it really wrote). The instance has
no access token: a cold read is the load of the state hash and the read from it. With a token each
first read would also wait for Polar's snapshot (the WebSocket, the listing, the apply script):
about 100 a second on the shared 2-vCPU machine, so three hours for a million; and the emulator
would then be measured as much as the instance. What a token adds per followed customer (its
snapshot flow, forgetting it at Polar) is measured by ``bench.following`` up to a million.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from bench._child import run_for_json
from bench._env import Env
from bench._million_child import WARM, customer
from bench._offline import prepare
from bench._stats import Figure, Side, Target, median
from outpost_core import Customer
from outpost_core import _keys as keys

FULL_N = 1_000_000
SMOKE_N = 1_000
SMOKE_BOUND = 250
"""Smoke runs go past a bound of their own (the default, 16,000, is beyond their reads)."""
RSS_LIMIT_MB = 100.0
RSS_TARGET = Target(on="ratio", op="<=", value=1.0)
RATE_TARGET = Target(on="ratio", op=">=", value=0.8)
SEED_BATCH = 10_000
SEED = """
local ttl = ARGV[1]
local n = tonumber(ARGV[2])
local fields = {}
for i = 3, 2 + 2 * n do fields[#fields + 1] = ARGV[i] end
for i = 3 + 2 * n, #ARGV do
  redis.call('HSET', ARGV[i], unpack(fields))
  redis.call('EXPIRE', ARGV[i], ttl)
end
return #ARGV - 2 - 2 * n
"""
SETUP = (
    "Redis holds {n} customers' state hashes (each the fields apply_snapshot wrote for one "
    "customer, seeded by a script, TTL eight days). One process, one sync Outpost without an "
    "access token, telemetry on, max_customers={bound}, reads each customer's balance once, in "
    "order, one thread: every read a first read (a load of the state hash, then the balance). "
    "Every {chunk} reads it times {base} bare HGETALLs of a state hash on a redis-py client of "
    "its own (the machine's drift). RSS: the process's growth beyond its RSS after its first "
    "read (gc.collect() first), at each tenth and at 1,000, 10,000 and 100,000 reads."
)


def run(env: Env) -> list[Figure]:
    smoke = env.scale.name == "smoke"
    n = SMOKE_N if smoke else FULL_N
    bound = SMOKE_BOUND if smoke else 0
    chunk = 100 if smoke else 1_000
    env.reset()
    client = env.client()
    seeded_s = _seed(client, n)
    result = _child(env.url, n, bound, chunk)
    result["seed_seconds"] = seeded_s
    return _rows(result)


def _seed(client: redis.Redis, n: int) -> float:
    """Every customer's state hash, as apply_snapshot writes it; the seconds it took."""
    started = time.monotonic()
    prepare(client, WARM)
    template = keys.state_key(Customer("external", WARM), "r-calls")
    fields = [x for pair in client.hgetall(template).items() for x in pair]
    ttl = client.ttl(template)
    seed = client.register_script(SEED)
    for start in range(0, n, SEED_BATCH):
        names = [
            keys.state_key(Customer("external", customer(i)), "r-calls")
            for i in range(start, min(n, start + SEED_BATCH))
        ]
        seed(keys=[], args=[ttl, len(fields) // 2, *fields, *names])
    return time.monotonic() - started


def _child(url: str, n: int, bound: int, chunk: int) -> dict[str, Any]:
    return run_for_json("bench._million_child", url, n, bound, chunk)


def _rows(result: dict[str, Any]) -> list[Figure]:
    n, bound, chunk = result["n"], result["bound"], result["chunk"]
    chunks = result["chunks"]
    rates = [c["reads"] / c["seconds"] for c in chunks]
    bare = [c["hgetall"] / c["hgetall_seconds"] for c in chunks]
    tenth = max(1, len(chunks) // 10)
    first, last = rates[:tenth], rates[-tenth:]
    # Chunk k of the last tenth against chunk k of the first; and the same with each chunk's
    # rate over the bare HGETALL rate measured beside it (what the machine's drift does to both).
    ratios = [b / a for a, b in zip(first, last, strict=True)]
    drift = [(rates[-tenth + k] / bare[-tenth + k]) / (rates[k] / bare[k]) for k in range(tenth)]
    growth = [c["rss_growth"] / 1e6 for c in result["checkpoints"]]
    setup = SETUP.format(n=f"{n:,}", bound=f"{bound:,}", chunk=chunk, base=max(1, chunk // 5))
    deciles = [
        round(sum(c["reads"] for c in part) / sum(c["seconds"] for c in part), 1)
        for part in (chunks[k * tenth : (k + 1) * tenth] for k in range(10))
        if part
    ]
    extra = {
        "customers": n,
        "max_customers": bound,
        "seed_seconds": result["seed_seconds"],
        "read_seconds": sum(c["seconds"] for c in chunks),
        "reads_per_second_by_tenth": deciles,
        "hgetall_per_second_first_last": [median(bare[:tenth]), median(bare[-tenth:])],
        "ratio_over_bare_hgetall": median(drift),
        "checkpoints": result["checkpoints"],
        "rejections": result["rejections"],
    }
    return [
        Figure(
            key="million.rss",
            title=f"RSS growth of one process reading {n:,} customers",
            unit="MB",
            subject=Side("RSS growth at the checkpoints", growth),
            baseline=Side("the limit", [RSS_LIMIT_MB]),
            ratios=[max(growth) / RSS_LIMIT_MB],
            ratio_meaning="largest growth / 100 MB",
            setup=setup,
            target=RSS_TARGET,
            extra=extra,
        ),
        Figure(
            key="million.read_rate",
            title=f"cold reads/s, the last tenth of {n:,} customers vs the first",
            unit="reads/s",
            subject=Side("last tenth", last, higher_is_better=True),
            baseline=Side("first tenth", first, higher_is_better=True),
            ratios=ratios,
            ratio_meaning=f"last / first, chunk by chunk ({chunk} reads each); JSON extra: the "
            "same over each chunk's bare HGETALL rate",
            setup=setup,
            target=RATE_TARGET,
            extra=extra,
        ),
    ]
