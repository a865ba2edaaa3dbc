"""apply_snapshot.lua against a real Redis: Polar's totals replace the buckets before cold_until."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis

from outpost_core import Aggregate
from tests.lua._scripts import (
    BUCKET,
    HOUR,
    TTL,
    B,
    Channel,
    Scripts,
    acked_key,
    bucket_key,
    changes,
    events_keys,
    field,
    pairs,
    state_key,
)

OLD, COLD, HOT = BUCKET - 2 * B, BUCKET - B, BUCKET
NOW = BUCKET + 60_000_000
POLAR = Aggregate.of([1.0, 2.0, 10.0])
E1, E2, E3, E4, E5 = (
    field(OLD, "e1"),
    field(OLD, "e2"),
    field(COLD, "e3"),
    field(HOT, "e4"),
    field(OLD, "e5"),
)


def prepare(scripts: Scripts) -> None:
    """Five events: e1 acknowledged two hours ago, e3 ten minutes ago, the others not."""
    scripts.track("e1", {"r1": 5}, bucket=OLD)
    scripts.track("e2", {"r1": 3}, bucket=OLD)
    scripts.track("e3", {"r1": 7}, bucket=COLD)
    scripts.track("e4", {"r1": 2}, bucket=HOT)
    scripts.track("e5", {"r1": 11}, bucket=OLD)
    scripts.settle("acknowledge", {"r1": [E1]}, now=NOW - 2 * HOUR)
    scripts.settle("acknowledge", {"r1": [E3]}, now=NOW - 10 * 60_000_000)
    assert scripts.rev("r1") == 7


def first(scripts: Scripts, **overrides: object) -> str:
    arguments: dict[str, object] = {
        "cold_until": HOT,
        "as_of": NOW - 1,
        "now": NOW,
        "counted": {"r1": [E2]},
        "credited": {"m1": 10, "m2": 2.5},
        "snapshot_id": "s-1",
    }
    arguments.update(overrides)
    return scripts.apply_snapshot({"r1": POLAR}, **arguments)  # type: ignore[arg-type]


def test_first_snapshot(scripts: Scripts, channel: Channel) -> None:
    prepare(scripts)
    channel.published()
    reply = first(scripts, known={"r1": 7})
    state = scripts.state("r1")
    assert state == {
        "rev": "8",
        "cu": str(HOT),
        "sa": str(NOW - 1),
        "sid": "s-1",
        "p": "3 13 1 10",
        "c:m1": "10",
        "c:m2": "2.5",
        f"a:{OLD}": "1 11 11 11",  # e1 dropped (acknowledged too long ago), e2 counted
        f"a:{COLD}": "1 7 7 7",  # e3 acknowledged recently: still pending
        f"a:{HOT}": "1 2 2 2",  # hot: untouched
        "n": "3",
        "u": "2",
    }
    assert scripts.events("r1") == {E3: f"7 {NOW - 600_000_000}", E4: "2", E5: "11"}
    [delta] = changes(reply)
    assert (delta["k"], delta["r"], delta["d"]) == (state_key("r1"), 8, [])
    assert pairs(delta["s"]) == {k: v for k, v in state.items() if k not in ("rev", f"a:{HOT}")}
    assert [changes(m) for m in channel.published()] == [[delta]]
    scripts.check("r1")


def test_an_emptied_cold_bucket_loses_its_aggregate(scripts: Scripts, channel: Channel) -> None:
    prepare(scripts)
    channel.published()
    first(scripts, counted={"r1": [E2, E5]})
    assert f"a:{OLD}" not in scripts.state("r1")
    [[change]] = [changes(m) for m in channel.published()]
    assert change["d"] == [f"a:{OLD}"]
    scripts.check("r1")


def test_unacknowledged_events_are_never_dropped(scripts: Scripts) -> None:
    prepare(scripts)
    first(scripts, now=NOW + 100 * HOUR, as_of=NOW + 100 * HOUR, counted={})
    events = scripts.events("r1")
    assert set(events) == {E2, E4, E5}  # both acknowledged ones are past the limit
    scripts.check("r1")


def test_the_pending_limit_is_strict(scripts: Scripts) -> None:
    scripts.track("e1", {"r1": 5}, bucket=OLD)
    scripts.settle("acknowledge", {"r1": [E1]}, now=NOW - HOUR)
    first(scripts, counted={}, keep=HOUR)
    assert E1 in scripts.events("r1")  # exactly the limit: kept
    scripts.apply_snapshot(
        {"r1": POLAR}, cold_until=HOT, as_of=NOW, now=NOW + 1, keep=HOUR, counted={}
    )
    assert E1 not in scripts.events("r1")
    scripts.check("r1")


def test_an_event_acknowledged_while_hot_stays_pending_until_the_limit(scripts: Scripts) -> None:
    """The race the invariant guards: acknowledged in a hot bucket, which a snapshot computed
    before then makes cold without counting the event."""
    scripts.track("e4", {"r1": 2}, bucket=HOT)
    acked = HOT + 30_000_000
    scripts.settle("acknowledge", {"r1": [E4]}, now=acked)
    scripts.apply_snapshot(
        {"r1": POLAR}, cold_until=HOT, as_of=acked + 1, now=acked + 1, counted={}
    )
    later = HOT + B  # the snapshot computed before Polar stored e4 makes its bucket cold
    scripts.apply_snapshot(
        {"r1": POLAR}, cold_until=later, as_of=acked + 2, now=acked + 2, counted={}
    )
    assert scripts.state("r1")[f"a:{HOT}"] == "1 2 2 2"
    assert scripts.state("r1")["n"] == "1"
    scripts.apply_snapshot(
        {"r1": POLAR}, cold_until=later, as_of=acked + HOUR + 1, now=acked + HOUR + 1, counted={}
    )
    assert f"a:{HOT}" not in scripts.state("r1")
    assert scripts.events("r1") == {}
    scripts.check("r1")


def test_counted_events_at_or_after_cold_until_stay(scripts: Scripts) -> None:
    prepare(scripts)
    first(scripts, counted={"r1": [E2, E4]})
    assert E4 in scripts.events("r1")
    assert scripts.state("r1")[f"a:{HOT}"] == "1 2 2 2"
    scripts.check("r1")


@pytest.mark.parametrize(
    ("cold_until", "as_of"),
    [
        (HOT - B, NOW + 100),  # cold_until lower, even with a later as_of
        (HOT, NOW - 1),  # the same snapshot again
        (HOT, NOW - 2),  # equal cold_until, earlier as_of
    ],
)
def test_a_stale_snapshot_changes_and_publishes_nothing(
    scripts: Scripts, channel: Channel, cold_until: int, as_of: int
) -> None:
    prepare(scripts)
    first(scripts)
    channel.published()
    before = scripts.dump()
    reply = scripts.apply_snapshot(
        {"r1": Aggregate.of([99.0])},
        cold_until=cold_until,
        as_of=as_of,
        now=NOW + 5,
        counted={"r1": [E5]},
        credited={"m1": 0},
        snapshot_id="s-stale",
    )
    assert changes(reply) == []
    assert scripts.dump() == before
    assert channel.published() == []


def test_equal_cold_until_with_a_later_as_of_applies(scripts: Scripts) -> None:
    prepare(scripts)
    first(scripts)
    scripts.apply_snapshot(
        {"r1": Aggregate.of([4.0])},
        cold_until=HOT,
        as_of=NOW,
        now=NOW,
        counted={"r1": [E5]},
        credited={"m1": 10},
        snapshot_id="s-2",
    )
    state = scripts.state("r1")
    assert (state["sid"], state["sa"], state["p"], state["rev"]) == (
        "s-2",
        str(NOW),
        "1 4 4 4",
        "9",
    )
    assert f"a:{OLD}" not in state
    scripts.check("r1")


def test_credits_are_replaced_and_old_ones_deleted(scripts: Scripts, channel: Channel) -> None:
    prepare(scripts)
    first(scripts)
    channel.published()
    scripts.apply_snapshot(
        {"r1": POLAR},
        cold_until=HOT,
        as_of=NOW,
        now=NOW,
        credited={"m1": 20, "m3": "0.5"},
        snapshot_id="s-2",
    )
    state = scripts.state("r1")
    assert {k: v for k, v in state.items() if k.startswith("c:")} == {"c:m1": "20", "c:m3": "0.5"}
    [[change]] = [changes(m) for m in channel.published()]
    assert change["d"] == ["c:m2"]
    assert ("c:m1", "20") in pairs(change["s"]).items()


def test_a_snapshot_without_meters_deletes_every_credit(scripts: Scripts) -> None:
    prepare(scripts)
    first(scripts)
    scripts.apply_snapshot({"r1": POLAR}, cold_until=HOT + B, as_of=NOW, now=NOW, credited={})
    assert not [k for k in scripts.state("r1") if k.startswith("c:")]


def test_re_applying_is_idempotent(scripts: Scripts) -> None:
    prepare(scripts)
    first(scripts)
    once = scripts.dump()
    for _ in range(3):
        assert changes(first(scripts)) == []
    assert scripts.dump() == once


def test_several_identities_of_one_customer(scripts: Scripts, channel: Channel) -> None:
    prepare(scripts)
    scripts.track("x1", {"r2": 4})
    channel.published()
    reply = scripts.apply_snapshot(
        {"r1": POLAR, "r2": Aggregate(), "r3": Aggregate.of([8.0])},
        cold_until=HOT,
        as_of=NOW,
        now=NOW,
        counted={"r1": [E2]},
        credited={"m1": 1},
    )
    assert [(c["k"], c["r"]) for c in changes(reply)] == [
        (state_key("r1"), 8),
        (state_key("r2"), 2),
        (state_key("r3"), 1),
    ]
    assert scripts.state("r3") == {
        "rev": "1",
        "cu": str(HOT),
        "sa": str(NOW),
        "sid": "s-1",
        "p": "1 8 8 8",
        "c:m1": "1",
        "n": "0",
        "u": "0",
    }
    assert scripts.state("r2")["p"] == "0 0 - -"
    [message] = channel.published()
    assert len(changes(message)) == 3
    for reducer_id in ("r1", "r2", "r3"):
        scripts.check(reducer_id)


def test_reply_modes(scripts: Scripts) -> None:
    prepare(scripts)
    [bare] = changes(first(scripts))
    assert bare == {"k": state_key("r1"), "r": 8}
    [full] = changes(
        scripts.apply_snapshot({"r1": POLAR}, cold_until=HOT, as_of=NOW, now=NOW, known={"r1": 3})
    )
    assert full["full"] == 1 and pairs(full["s"]) == scripts.state("r1")


def test_ttls_of_the_keys_it_writes(scripts: Scripts, client: redis.Redis) -> None:
    """The state hash, the acknowledged set and the buckets it makes cold get eight days again;
    the hot bucket's hash is none of its business: not even its TTL is touched."""
    prepare(scripts)
    for key in (state_key("r1"), acked_key("r1"), *events_keys(client, "r1")):
        client.persist(key)
    first(scripts)
    for key in (state_key("r1"), acked_key("r1"), bucket_key("r1", OLD), bucket_key("r1", COLD)):
        ttl = client.ttl(key)
        assert TTL - 5 <= ttl <= TTL, (key, ttl)
    assert client.ttl(bucket_key("r1", HOT)) == -1


def test_track_after_a_snapshot_into_a_cold_bucket(scripts: Scripts) -> None:
    """A late event lands in a bucket before cold_until: it counts whole until a snapshot."""
    prepare(scripts)
    first(scripts)
    scripts.track("late", {"r1": 1}, bucket=OLD)
    assert scripts.state("r1")[f"a:{OLD}"] == "2 12 1 11"
    scripts.check("r1")
    scripts.apply_snapshot(
        {"r1": POLAR}, cold_until=HOT, as_of=NOW, now=NOW, counted={"r1": [field(OLD, "late")]}
    )
    assert scripts.state("r1")[f"a:{OLD}"] == "1 11 11 11"
    scripts.check("r1")


# -- what a snapshot reads ------------------------------------------------------------------------
#
# Under an LFU eviction policy with `lfu-log-factor 0` and `lfu-decay-time 0`, Redis adds exactly
# one to a key's access counter (OBJECT FREQ, which does not count itself) on every access, and
# never decays it: the counter tells, without timing anything, whether a script read a key.


@pytest.fixture
def counting(client: redis.Redis) -> Iterator[None]:
    names = ("maxmemory-policy", "lfu-log-factor", "lfu-decay-time")
    saved = {name: cast(Any, client.config_get(name))[name] for name in names}
    client.config_set("maxmemory-policy", "allkeys-lfu")
    client.config_set("lfu-log-factor", 0)
    client.config_set("lfu-decay-time", 0)
    yield
    for name, value in saved.items():
        client.config_set(name, value)


def _holding(client: redis.Redis, reducer_id: str, fields: set[str]) -> set[str]:
    """The identity's events keys that hold any of ``fields``."""
    state = state_key(reducer_id)
    found = set()
    for raw in cast(list[bytes], list(client.scan_iter(match=state + ":*"))):
        key = raw.decode() if isinstance(raw, bytes) else raw
        # one access per key: the counter saturates at 255
        if client.type(key) != b"hash":
            continue
        if fields & {n.decode() for n in cast(list[bytes], client.hkeys(key))}:
            found.add(key)
    return found


def _reads(client: redis.Redis, names: set[str]) -> dict[str, int]:
    return {key: int(cast(int, client.object("freq", key))) for key in names}


def test_a_snapshot_reads_no_hot_event(
    scripts: Scripts, client: redis.Redis, counting: None
) -> None:
    """Hot pending events cost a snapshot nothing, however many: the keys holding them are not
    accessed at all, while the bucket it makes cold is read (so the counter does see reads)."""
    scripts.track("c1", {"r1": 1}, bucket=COLD)
    hot = [field(HOT + (n % 3) * B, f"h{n}") for n in range(60)]
    for name in hot:
        bucket, event_id = name.split(":")
        scripts.track(event_id, {"r1": 1}, bucket=int(bucket))
    scripts.settle("acknowledge", {"r1": hot[:20]}, now=NOW - 2 * HOUR)  # expired, but hot
    hot_keys = _holding(client, "r1", set(hot))
    cold_keys = _holding(client, "r1", {field(COLD, "c1")})
    assert hot_keys and cold_keys
    before = _reads(client, hot_keys | cold_keys)
    assert max(before.values()) < 200  # far from saturated (255)
    first(scripts, counted={})
    after = _reads(client, hot_keys | cold_keys)
    assert {k: after[k] for k in hot_keys} == {k: before[k] for k in hot_keys}
    assert all(after[k] > before[k] for k in cold_keys)
    assert len(scripts.events("r1")) == 61  # the hot ones stay, acknowledged or not
    scripts.check("r1")


def test_a_later_snapshot_reads_only_the_buckets_it_makes_cold(
    scripts: Scripts, client: redis.Redis, counting: None
) -> None:
    """Buckets already cold that lose nothing are not read again."""
    prepare(scripts)
    first(scripts)
    scripts.track("e6", {"r1": 4}, bucket=HOT + B)
    old_keys = _holding(client, "r1", {E3, E5})
    hot_keys = _holding(client, "r1", {E4})
    later_keys = _holding(client, "r1", {field(HOT + B, "e6")})
    before = _reads(client, old_keys | hot_keys | later_keys)
    scripts.apply_snapshot(
        {"r1": POLAR}, cold_until=HOT + B, as_of=NOW + 1, now=NOW + 1, snapshot_id="s-2"
    )
    after = _reads(client, old_keys | hot_keys | later_keys)
    assert {k: after[k] for k in old_keys | later_keys} == {
        k: before[k] for k in old_keys | later_keys
    }
    assert all(after[k] > before[k] for k in hot_keys)  # HOT became cold: read and rebuilt
    assert scripts.state("r1")["cu"] == str(HOT + B)
    scripts.check("r1")


def test_confirm_reads_only_the_buckets_of_its_events(
    scripts: Scripts, client: redis.Redis, counting: None
) -> None:
    prepare(scripts)
    others = _holding(client, "r1", {E3, E4})
    before = _reads(client, others)
    scripts.settle("confirm", {"r1": [E2]})
    assert _reads(client, others) == before
    assert E2 not in scripts.events("r1")
    scripts.check("r1")


def test_the_acknowledged_set_follows_the_events(scripts: Scripts) -> None:
    """Acknowledged events are indexed by time until they leave: counted, dropped or expired."""
    prepare(scripts)
    assert scripts.acked("r1") == {E1: NOW - 2 * HOUR, E3: NOW - 10 * 60_000_000}
    scripts.settle("acknowledge", {"r1": [E4]}, now=NOW)
    first(scripts, counted={"r1": [E3]})  # E1 expires, E3 is counted, E4 is hot
    assert scripts.acked("r1") == {E4: NOW}
    scripts.settle("confirm", {"r1": [E4]})
    assert scripts.acked("r1") == {}
    scripts.check("r1")


def test_a_bucket_hash_gone_on_its_own_counts_until_its_bucket_goes_cold(
    scripts: Scripts, client: redis.Redis
) -> None:
    """A bucket hash that expired on its own (no script wrote it for eight days) leaves its `a:`
    field and `n` counting its events: more local consumption, never less. The snapshot that
    makes the bucket cold reads the hash, finds it empty, and drops both. `u` (a status figure,
    not part of the balance) keeps counting the undelivered ones it lost."""
    prepare(scripts)
    client.delete(bucket_key("r1", OLD))  # e1, e2, e5: 3 events, 19 units
    assert scripts.state("r1")[f"a:{OLD}"] == "3 19 3 11"
    first(scripts, counted={})
    state = scripts.state("r1")
    assert f"a:{OLD}" not in state
    assert (state["n"], state[f"a:{COLD}"]) == ("2", "1 7 7 7")
    assert set(scripts.events("r1")) == {E3, E4}
    assert state["u"] == "3"  # e2 and e5 went with the hash: 1 is true
    assert E1 not in scripts.acked("r1")  # expired: its hour was over
