"""Stand-ins for what Polar sends, for tests that run before (or without) the WebSocket: the
configuration payload, and snapshots applied through the real apply_snapshot script."""

from __future__ import annotations

import json
from typing import Any

import redis

from outpost_core import SCRIPT_TEXT, Aggregate, Customer, floor_bucket
from outpost_core import _keys as keys
from outpost_core._inspect import events_keys
from tests.support.payloads import configuration as configuration
from tests.support.payloads import reducer as reducer

HOUR_US = 3_600_000_000


def store_configuration(client: redis.Redis, payload: dict[str, Any]) -> None:
    client.set(keys.CONFIGURATION_KEY, json.dumps(payload))


def apply_snapshot(
    client: redis.Redis,
    customer: Customer,
    *,
    cold_until: int,
    as_of: int,
    now: int,
    totals: dict[str, Aggregate],
    credited: dict[str, float],
    counted: dict[str, list[str]] | None = None,
    snapshot_id: str = "s-test",
    shards: int = keys.DEFAULT_SHARDS,
) -> Any:
    """Run apply_snapshot as the SDK does: ``counted`` maps reducer id → counted event ids;
    ``shards``: the deployment's count."""
    counted = counted or {}
    script = client.register_script(SCRIPT_TEXT["apply_snapshot"])
    keys_: list[str] = []
    args: list[Any] = [
        keys.channel(keys.shard_of(customer, shards)),
        now,
        HOUR_US,
        cold_until,
        as_of,
        snapshot_id,
    ]
    args.append(len(credited))
    for meter_id, units in credited.items():
        args += [meter_id, units]
    for reducer_id, aggregate in totals.items():
        state = keys.state_key(customer, reducer_id, shards)
        keys_ += [state, keys.acked_key(state)]
        index = {_text(k): _text(v) for k, v in client.hgetall(state).items()}
        listed = [f for key in events_keys(state, index) for f in client.hkeys(key)]
        pending = [_text(f) for f in listed]
        fields = [f for f in pending for e in counted.get(reducer_id, []) if f.endswith(f":{e}")]
        args += [-1, aggregate.encode(), len(fields), *fields]
    return script(keys=keys_, args=args)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def bucket_of(t_us: int) -> int:
    return floor_bucket(t_us)
