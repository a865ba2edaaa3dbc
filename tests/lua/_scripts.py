"""Calling the scripts of ``lua/`` exactly as their header comments lay out KEYS and ARGV."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, cast

import redis

from outpost_core import SCRIPT_TEXT, Aggregate, Customer
from outpost_core import _keys as keys

CUSTOMER = Customer("external", "c1")
SHARD = keys.shard_of(CUSTOMER)
CHANNEL = keys.channel(SHARD)
OUTBOX = keys.outbox_key(SHARD)
GROUP = "outpost"
TTL = 691_200
BUCKET = 1_796_223_600_000_000  # a bucket boundary (2026-12-02T15:00Z)
B = 300_000_000  # one bucket
HOUR = 3_600_000_000


def state_key(reducer_id: str) -> str:
    return keys.state_key(CUSTOMER, reducer_id)


def bucket_key(reducer_id: str, bucket: int = BUCKET) -> str:
    """The events hash of one bucket of the identity."""
    return keys.bucket_key(state_key(reducer_id), bucket)


def acked_key(reducer_id: str) -> str:
    return keys.acked_key(state_key(reducer_id))


def events_keys(client: redis.Redis, reducer_id: str) -> list[str]:
    """Every events hash of the identity that exists (found by SCAN: tests only)."""
    match = state_key(reducer_id).replace("[", "\\[") + ":ev:*"
    return sorted(k.decode() for k in cast(list[bytes], list(client.scan_iter(match=match))))


def field(bucket: int, event_id: str) -> str:
    return f"{bucket}:{event_id}"


def as_list(value: Any) -> list[Any]:
    """cjson writes an empty list as ``{}``."""
    if value == {}:
        return []
    assert isinstance(value, list)
    return value


def pairs(flat: Sequence[str]) -> dict[str, str]:
    assert len(flat) % 2 == 0
    return dict(zip(flat[::2], flat[1::2], strict=True))


FRESH = 10**12
"""Revisions from here up are Redis-clock based: what a hash that did not exist starts from."""
_bases: dict[str, int] = {}


def reset_revisions() -> None:
    _bases.clear()


def relative(key: str, rev: int) -> int:
    """A hash's revision counted from its first one (which reads as 1), as these tests state
    them; revisions of hashes a test wrote itself, below ``FRESH``, are left as they are."""
    if rev < FRESH:
        return rev
    return rev - _bases.setdefault(key, rev) + 1


def absolute(key: str, rev: int) -> int:
    """The inverse of :func:`relative`, for the revision a caller says it holds."""
    return rev + _bases[key] - 1 if key in _bases and rev > 0 else rev


def changes(reply: Any) -> list[dict[str, Any]]:
    """The changes of a reply or message, with empty ``{}`` lists read as lists and revisions
    read as :func:`relative` ones."""
    obj = json.loads(reply)
    out = []
    for change in as_list(obj["c"]):
        change = dict(change)
        change["r"] = relative(change["k"], change["r"])
        for name in ("s", "d"):
            if name in change:
                change[name] = as_list(change[name])
        if change.get("full") and "s" in change:
            flat = list(change["s"])
            for i in range(0, len(flat), 2):
                if flat[i] == "rev":
                    flat[i + 1] = str(relative(change["k"], int(flat[i + 1])))
            change["s"] = flat
        out.append(change)
    return out


class Scripts:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._scripts = {name: client.register_script(text) for name, text in SCRIPT_TEXT.items()}

    def run(self, name: str, keys_: Sequence[str], args: Sequence[Any]) -> str:
        """The script's reply (its changes, as text); the published text a pair carries beside
        them is kept in ``echo``."""
        reply = self._scripts[name](keys=list(keys_), args=list(args))
        self.echo: str | None = None
        if isinstance(reply, list):  # [published, reply]
            published, reply = reply
            self.echo = published.decode("utf-8")
        assert isinstance(reply, bytes)
        for key in keys_:  # note where each new hash's revisions start
            if key != OUTBOX and ":ev:" not in key and not key.endswith(":acked"):
                rev = self.client.hget(key, "rev")
                if rev is not None:
                    relative(key, int(rev))
        return reply.decode("utf-8")

    def track(
        self,
        event_id: str,
        values: Mapping[str, float | str],
        *,
        bucket: int = BUCKET,
        known: Mapping[str, int] | None = None,
        item: Mapping[str, Any] | None = None,
    ) -> str:
        """Track one event into the identities of ``values`` (reducer id → value)."""
        known = known or {}
        states = [state_key(r) for r in values]
        keys_ = [OUTBOX]
        for reducer_id in values:
            keys_ += [state_key(reducer_id), bucket_key(reducer_id, bucket)]
        item = item or {"name": "api_call", "external_customer_id": "c1", "external_id": event_id}
        args: list[Any] = [
            CHANNEL,
            field(bucket, event_id),
            str(bucket),
            json.dumps(item),
            json.dumps(states),
        ]
        for reducer_id, value in values.items():
            args += [absolute(state_key(reducer_id), known.get(reducer_id, -1)), value]
        return self.run("track", keys_, args)

    def settle(
        self,
        script: str,
        fields: Mapping[str, Sequence[str]],
        *,
        ids: Sequence[str] = (),
        now: int = BUCKET,
        known: Mapping[str, int] | None = None,
        group: str = GROUP,
    ) -> str:
        """acknowledge or confirm: ``fields`` maps reducer id → events-hash fields."""
        known = known or {}
        keys_ = [OUTBOX]
        args: list[Any] = [CHANNEL, group, now, len(ids), *ids]
        for reducer_id, names in fields.items():
            keys_ += [state_key(reducer_id), acked_key(reducer_id)]
            args += [absolute(state_key(reducer_id), known.get(reducer_id, -1)), len(names), *names]
        return self.run(script, keys_, args)

    def apply_snapshot(
        self,
        totals: Mapping[str, Aggregate],
        *,
        cold_until: int,
        as_of: int,
        now: int,
        counted: Mapping[str, Sequence[str]] | None = None,
        credited: Mapping[str, float | str] | None = None,
        keep: int = HOUR,
        snapshot_id: str = "s-1",
        known: Mapping[str, int] | None = None,
    ) -> str:
        counted = counted or {}
        credited = credited if credited is not None else {}
        known = known or {}
        keys_: list[str] = []
        args: list[Any] = [CHANNEL, now, keep, cold_until, as_of, snapshot_id, len(credited)]
        for meter_id, units in credited.items():
            args += [meter_id, units]
        for reducer_id, aggregate in totals.items():
            names = counted.get(reducer_id, [])
            keys_ += [state_key(reducer_id), acked_key(reducer_id)]
            known_rev = absolute(state_key(reducer_id), known.get(reducer_id, -1))
            args += [known_rev, aggregate.encode(), len(names), *names]
        return self.run("apply_snapshot", keys_, args)

    # -- reading Redis ----------------------------------------------------------------------------

    def hash(self, key: str) -> dict[str, str]:
        raw = cast(dict[bytes, bytes], self.client.hgetall(key))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def state(self, reducer_id: str) -> dict[str, str]:
        key = state_key(reducer_id)
        fields = self.hash(key)
        if "rev" in fields:
            fields["rev"] = str(relative(key, int(fields["rev"])))
        return fields

    def events(self, reducer_id: str) -> dict[str, str]:
        """The fields of every events hash of the identity, together."""
        out: dict[str, str] = {}
        for key in events_keys(self.client, reducer_id):
            out.update(self.hash(key))
        return out

    def acked(self, reducer_id: str) -> dict[str, int]:
        pairs = self.client.zrange(acked_key(reducer_id), 0, -1, withscores=True)
        return {k.decode(): int(v) for k, v in cast(list[tuple[bytes, float]], pairs)}

    def rev(self, reducer_id: str) -> int:
        return int(self.state(reducer_id).get("rev", 0))

    def dump(self) -> dict[str, Any]:
        """Everything in the database, to show that a call wrote nothing."""
        out: dict[str, Any] = {}
        for raw in cast(list[bytes], self.client.keys("*")):
            out[raw.decode()] = self.client.dump(raw)
        return out

    def check_ttls(self, reducer_id: str) -> None:
        """Every key of the identity (state hash, events hashes, acknowledged set) expires in TTL
        seconds (less the few the test took)."""
        names = [state_key(reducer_id), *events_keys(self.client, reducer_id)]
        if self.client.exists(acked_key(reducer_id)):
            names.append(acked_key(reducer_id))
        for key in names:
            ttl = self.client.ttl(key)
            assert isinstance(ttl, int) and TTL - 5 <= ttl <= TTL, (key, ttl)

    def check(self, reducer_id: str) -> None:
        """What every script leaves behind: counters and bucket aggregates match the events."""
        state, events = self.state(reducer_id), self.events(reducer_id)
        if not state:
            assert not events
            return
        assert int(state["n"]) == len(events)
        assert int(state["u"]) == sum(1 for v in events.values() if " " not in v)
        # The acknowledged set indexes exactly the acknowledged pending events, by time.
        acked = {name: int(v.split(" ")[1]) for name, v in events.items() if " " in v}
        assert self.acked(reducer_id) == acked
        # Each field lives in the hash of its own bucket.
        for key in events_keys(self.client, reducer_id):
            start = key.rsplit(":", 1)[1]
            assert all(name.startswith(f"{start}:") for name in self.hash(key)), key
        by_bucket: dict[int, list[float]] = defaultdict(list)
        for name, value in events.items():
            by_bucket[int(name.split(":", 1)[0])].append(float(value.split(" ")[0]))
        buckets = {int(name[2:]) for name in state if name.startswith("a:")}
        assert buckets == set(by_bucket)
        for bucket, values in by_bucket.items():
            stored = Aggregate.decode(state[f"a:{bucket}"])
            expected = Aggregate.of(values)
            assert stored is not None
            assert (stored.count, stored.min, stored.max) == (
                expected.count,
                expected.min,
                expected.max,
            )
            assert math.isclose(stored.sum, expected.sum, rel_tol=1e-12, abs_tol=1e-12)


class Channel:
    """The shard channel, followed with SSUBSCRIBE."""

    def __init__(self, client: redis.Redis, pubsub: Any) -> None:
        self._client = client
        self._pubsub = pubsub
        self._n = 0

    def published(self) -> list[str]:
        """Everything published on the channel since the last call (a marker ends the wait)."""
        self._n += 1
        marker = f"marker-{self._n}"
        self._client.spublish(CHANNEL, marker)
        out: list[str] = []
        while True:
            message = self._pubsub.get_sharded_message(timeout=5)
            assert message is not None, "the marker never arrived"
            if message["type"] != "smessage":
                continue
            data = message["data"].decode("utf-8")
            if data == marker:
                return out
            out.append(data)
