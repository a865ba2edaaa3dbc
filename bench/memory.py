"""Memory: bytes per warm customer-meter in the process (tracemalloc), and Redis bytes per
identity after an hour of events (``MEMORY USAGE``)."""

from __future__ import annotations

import gc
import time
import tracemalloc
from typing import Any

import redis

from bench import _naive
from bench._env import Env, reducer_of
from bench._stats import Figure, Side
from outpost_core import BUCKET_US, Customer, from_us
from outpost_core import _keys as keys
from outpost_sync import Outpost

HOUR_US = 3_600_000_000
EVENTS_PER_CUSTOMER = 3
PROCESS_SETUP = (
    "Per round, {n} new customers, each with {e} events tracked and delivered by another "
    "instance; then one instance connected to the emulator reads each customer's balance once "
    "(its first read: load, snapshot request, apply). Bytes = growth of tracemalloc's traced "
    "memory over the round (after gc; every thread's allocations) / customers; the emulator "
    "runs in another process. Baseline: a dict of the same identities' raw HGETALL replies "
    "(what a naive cache would hold), object by object with sys.getsizeof."
)
REDIS_SETUP = (
    "One identity (one count meter), {e} events tracked with timestamps spread evenly over the "
    "hour before now, with Polar's syncs paused; delivered (flush), so every event is pending "
    "and acknowledged (baseline: the worst case). Then syncs resume and the emulator's clock "
    "moves past the last bucket's sync, and the instance applies the snapshots that count them "
    "(subject). Bytes = MEMORY USAGE ... SAMPLES 0 of the identity's state hash + events hash."
)


def run(env: Env) -> list[Figure]:
    env.reset()
    return [_process(env), _redis_hour(env)]


def _bytes_figure(
    key: str,
    title: str,
    subject: tuple[str, list[float]],
    baseline: tuple[str, list[float]],
    ratio_meaning: str,
    setup: str,
    extra: dict[str, Any],
) -> Figure:
    """A memory row: one value a round on each side (bytes, labelled), the ratio per round."""
    (label, values), (base_label, base) = subject, baseline
    return Figure(
        key=key,
        title=title,
        unit="bytes",
        subject=Side(label, values),
        baseline=Side(base_label, base),
        ratios=[s / b for s, b in zip(values, base, strict=True)],
        ratio_meaning=ratio_meaning + "; p50/p99 over rounds",
        setup=setup,
        extra=extra,
    )


def _identity_keys(client: redis.Redis, state: str) -> list[str]:
    """Every key of one identity: its state hash, its bucket hashes and acknowledged set."""
    found = client.scan_iter(match=f"{state}:*", count=1000)
    return [state, *(k.decode() if isinstance(k, bytes) else str(k) for k in found)]


def _usage(client: redis.Redis, *names: str) -> int:
    total = 0
    for name in names:
        found = client.memory_usage(name, samples=0)
        total += int(found) if found is not None else 0
    return total


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def _options(env: Env) -> dict[str, Any]:
    emu = env.emulator
    return dict(
        access_token=emu.token,
        server_url=emu.url,
        redis_url=env.url,
        telemetry=False,
        snapshot_timeout=30.0,  # tracemalloc slows every allocation: no NotReady for that
    )


def _process(env: Env) -> Figure:
    scale = env.scale
    meter = env.meter
    reducer = reducer_of(env.emulator, meter)
    client = env.client()
    subject: list[float] = []
    baseline: list[float] = []
    state_bytes: list[float] = []
    with Outpost(**_options(env)) as filler, Outpost(**_options(env)) as sdk:
        sdk.balance(meter, external_customer_id="bench-mem-warm-up")
        tracemalloc.start()
        try:
            for r in range(scale.memory_rounds):
                customers = [f"bench-mem-{r}-{n}" for n in range(scale.memory_customers)]
                for customer in customers:
                    for _ in range(EVENTS_PER_CUSTOMER):
                        filler.track("api_call", external_customer_id=customer)
                if not filler.flush(60):
                    raise RuntimeError("the filler's events were not delivered within 60 s")
                names = [keys.state_key(Customer("external", c), reducer) for c in customers]

                before = _traced()
                for customer in customers:
                    sdk.balance(meter, external_customer_id=customer)
                time.sleep(0.2)  # pushes and acknowledgements in flight settle
                subject.append((_traced() - before) / len(customers))
                # The same identities, in the state the instance holds (snapshot applied).
                baseline.append(_naive.size(_naive.load(client, names)) / len(customers))
                state_bytes.append(_usage(client, *names) / len(customers))
        finally:
            tracemalloc.stop()
    return _bytes_figure(
        "memory.process",
        "process memory per warm customer-meter",
        ("Outpost instance (sync)", subject),
        ("dict of raw HGETALL replies", baseline),
        "instance bytes / raw-reply-cache bytes per round",
        PROCESS_SETUP.format(n=scale.memory_customers, e=EVENTS_PER_CUSTOMER),
        {
            "customers_per_round": scale.memory_customers,
            "events_per_customer": EVENTS_PER_CUSTOMER,
            "redis_state_hash_bytes": sorted(state_bytes)[len(state_bytes) // 2],
        },
    )


def _wait(check: Any, timeout: float, what: str, explain: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            why = f": {explain()}" if explain is not None else ""
            raise RuntimeError(f"{what} did not happen within {timeout} s{why}")
        time.sleep(0.01)


def _snapshot_story(sdk: Outpost, meter: str, name: str, emu: Any) -> str:
    """What a wait for snapshots found: the copy, Redis, and what Polar (the emulator) sent."""

    def shown(balance: Any) -> str:
        return (
            f"pending {balance.pending}, cold_until {balance.cold_until}, "
            f"snapshot {balance.snapshot_id} as of {balance.snapshot_as_of}, rev {balance.revision}"
        )

    warm = sdk.balance(meter, external_customer_id=name)
    fresh = sdk.balance(meter, external_customer_id=name, fresh=True)
    counters = emu.state().get("counters", {})
    return f"copy: {shown(warm)}; Redis: {shown(fresh)}; emulator counters: {counters}"


def _redis_hour(env: Env) -> Figure:
    scale = env.scale
    emu, meter = env.emulator, env.meter
    reducer = reducer_of(emu, meter)
    client = env.client()
    events = scale.identity_events
    counted: list[float] = []
    pending: list[float] = []
    undelivered: list[float] = []
    outbox: list[float] = []
    for r in range(scale.identity_rounds):
        name = f"bench-hour-{r}"
        customer = Customer("external", name)
        state = keys.state_key(customer, reducer)
        stream = keys.outbox_key(keys.shard_of(customer))
        emu.pause_syncs()
        try:
            with Outpost(**_options(env)) as sdk:

                def balance(sdk: Outpost = sdk, name: str = name) -> Any:
                    return sdk.balance(meter, external_customer_id=name)

                balance()  # follow the identity: the snapshots that count its events reach it
                stream_before = _usage(client, stream)
                end = time.time_ns() // 1000 - 1_000_000
                for n in range(events):
                    at = end - HOUR_US + (n + 1) * HOUR_US // events
                    sdk.track("api_call", external_customer_id=name, timestamp=from_us(at))
                undelivered.append(_usage(client, *_identity_keys(client, state)))
                outbox.append((_usage(client, stream) - stream_before) / events)
                if not sdk.flush(120):
                    raise RuntimeError("the hour of events was not delivered within 120 s")
                _wait(lambda: balance().undelivered == 0, 30, "every acknowledgement")
                pending.append(_usage(client, *_identity_keys(client, state)))
                # The clock first, then the syncs: the one snapshot the resume pushes has every
                # bucket cold. The other way round, a resume less than a sync delay after a bucket
                # ended counted that bucket's (late) events in a snapshot that still called it
                # hot, and the advance, moving no event, pushed nothing more: the copy kept them
                # pending until it asked again (it asks only at a read that waits, or a reconnect).
                emu.advance((BUCKET_US + 2 * 60_000_000) / 1e6)  # past the last bucket's sync
                emu.resume_syncs()
                _wait(
                    lambda: balance().pending == 0,
                    60,
                    "snapshots counting every event",
                    lambda sdk=sdk, name=name: _snapshot_story(sdk, meter, name, emu),
                )
                counted.append(_usage(client, *_identity_keys(client, state)))
        finally:
            emu.resume_syncs()
    return _bytes_figure(
        "memory.redis_identity_hour",
        "Redis bytes per identity after an hour of events",
        ("counted by snapshots", counted),
        ("every event pending (acknowledged)", pending),
        "bytes once counted / bytes with every event pending",
        REDIS_SETUP.format(e=events),
        {
            "events_per_hour": events,
            "pending_bytes_per_event": sorted(pending)[len(pending) // 2] / events,
            "undelivered_bytes": sorted(undelivered)[len(undelivered) // 2],
            "outbox_bytes_per_undelivered_event": sorted(outbox)[len(outbox) // 2],
        },
    )
