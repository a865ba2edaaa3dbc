"""reserve.lua, release.lua and admit.lua against a real Redis: holds are counted while their
expiry is after `now`, over every name of the customer; a refusal writes nothing; a release frees
its own hold only; a commit records the event and frees its hold in one script; snapshots keep
holds."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis

from outpost_core import Aggregate, Customer
from outpost_core import _keys as keys
from tests.lua._scripts import (
    BUCKET,
    CHANNEL,
    OUTBOX,
    Scripts,
    bucket_key,
    changes,
    field,
    state_key,
)

NOW = BUCKET + 1_000
COUNT = "m-count"
ST = state_key("r1")
ALIAS = Customer("external", "c1-alias")  # same shard or not: one Redis takes any keys
ALIAS_ST = keys.state_key(ALIAS, "r1")


def snapshot(
    client: redis.Redis,
    key: str,
    *,
    credited: float,
    polar: str = "0 0 - -",
    cold: int = BUCKET,
    as_of: int = BUCKET,
    extra: dict[str, str] | None = None,
) -> None:
    fields: dict[Any, Any] = {
        "rev": "5",
        "cu": str(cold),
        "sa": str(as_of),
        "sid": "s",
        "p": polar,
    }
    fields[f"c:{COUNT}"] = str(credited)
    fields.update(extra or {})
    client.hset(key, mapping=fields)


def reserve(scripts: Scripts, units: float, hold: str, *, now: int = NOW, ttl: int = 1_000,
            names: Sequence[str] = (), func: str = "count", known: int = -1) -> Any:  # fmt: skip
    args = [CHANNEL, now, f"h:{hold}", units, now + ttl, func, f"c:{COUNT}", known]
    return json.loads(scripts.run("reserve", [ST, *names], args))


def release(scripts: Scripts, hold: str, *, now: int = NOW) -> list[dict[str, Any]]:
    known = int(scripts.hash(ST)["rev"])
    return changes(scripts.run("release", [ST], [CHANNEL, now, f"h:{hold}", known]))


def admit(scripts: Scripts, event_id: str, value: float, *, check: str = "count",
          hold: str = "", hold_key: str | None = None, names: Sequence[str] = (),
          now: int = NOW) -> Any:  # fmt: skip
    keys_ = [OUTBOX, ST, bucket_key("r1")]
    hold_at = 0
    if hold:
        if hold_key in (None, ST):
            hold_at = 2
        else:
            assert hold_key is not None
            keys_.append(hold_key)
            hold_at = len(keys_)
    name_at = []
    for name in names:
        keys_.append(name)
        name_at.append(len(keys_))
    item = {"name": "api_call", "external_customer_id": "c1", "external_id": event_id}
    args: list[Any] = [CHANNEL, field(BUCKET, event_id), BUCKET, json.dumps(item)]
    args += [json.dumps([ST]), now, 1, f"h:{hold}" if hold else "", hold_at, -1]
    credits = [f"c:{COUNT}"] if check else []
    args += [-1, value, check, len(credits), *credits, len(name_at), *name_at]
    return json.loads(scripts.run("admit", keys_, args))


def holds(scripts: Scripts, key: str = ST) -> dict[str, str]:
    return {k: v for k, v in scripts.hash(key).items() if k.startswith("h:")}


def test_a_reservation_holds_what_the_balance_covers_and_refuses_the_rest(
    scripts: Scripts, client: redis.Redis
) -> None:
    snapshot(client, ST, credited=10, polar="2 2 1 1")  # 8 left
    reply = reserve(scripts, 5, "a", known=5)
    assert reply["c"][0]["s"] == ["h:a", f"5 {NOW + 1000}"]
    before = scripts.dump()
    assert reserve(scripts, 4, "b") == {"no": [COUNT, "8", "5"]}
    assert scripts.dump() == before  # nothing written
    assert "c" in reserve(scripts, 3, "b")
    assert reserve(scripts, 3, "b") == {"dup": 1}  # a retried reserve writes nothing
    assert holds(scripts) == {"h:a": f"5 {NOW + 1000}", "h:b": f"3 {NOW + 1000}"}


def test_a_hold_stops_counting_at_its_expiry_and_is_pruned(
    scripts: Scripts, client: redis.Redis
) -> None:
    snapshot(client, ST, credited=4)
    reserve(scripts, 4, "a", ttl=100)
    # One µs before its expiry it still counts; at its expiry it does not.
    assert reserve(scripts, 1, "b", now=NOW + 99) == {"no": [COUNT, "4", "4"]}
    reply = reserve(scripts, 4, "b", now=NOW + 100, known=6)
    [change] = changes(json.dumps(reply))
    assert change["d"] == ["h:a"]  # the expired hold is pruned by the script that writes
    assert holds(scripts) == {"h:b": f"4 {NOW + 1100}"}


def test_a_release_frees_its_own_hold_only(scripts: Scripts, client: redis.Redis) -> None:
    snapshot(client, ST, credited=10)
    reserve(scripts, 2, "a")
    reserve(scripts, 3, "b")
    [change] = release(scripts, "a")
    assert (change["s"], change["d"]) == ([], ["h:a"])
    assert holds(scripts) == {"h:b": f"3 {NOW + 1000}"}
    assert release(scripts, "a") == []  # twice: nothing
    assert release(scripts, "zzz") == []


def test_every_name_s_events_and_holds_count_and_the_newest_snapshot_credits(
    scripts: Scripts, client: redis.Redis
) -> None:
    snapshot(client, ST, credited=10)
    # The other name's snapshot is newer: its credits (6) and totals (1) count; its pending
    # event and its hold count too.
    snapshot(client, ALIAS_ST, credited=6, polar="1 1 1 1", cold=BUCKET + 1,
             extra={f"a:{BUCKET + 1}": "1 1 1 1", "h:x": f"2 {NOW + 5}"})  # fmt: skip
    assert reserve(scripts, 3, "a", names=[ALIAS_ST]) == {"no": [COUNT, "4", "2"]}
    assert "c" in reserve(scripts, 2, "a", names=[ALIAS_ST])
    # An expired hold of the other name neither counts nor is pruned (its hash is not written).
    assert "c" in reserve(scripts, 2, "b", names=[ALIAS_ST], now=NOW + 5)
    assert "h:x" in holds(scripts, ALIAS_ST)


def test_admit_checks_then_records_in_one_script(scripts: Scripts, client: redis.Redis) -> None:
    snapshot(client, ST, credited=2)
    reserve(scripts, 1, "a")
    assert "c" in admit(scripts, "e1", 1)
    before = scripts.dump()
    assert admit(scripts, "e2", 1) == {"no": [COUNT, "1", "1"]}
    assert scripts.dump() == before
    assert admit(scripts, "e1", 1) == {"dup": 1}  # a retry of an admitted event
    # A commit: no check, the event recorded and its hold released by the same script.
    admit(scripts, "e3", 5, check="", hold="a")
    assert holds(scripts) == {}
    before = scripts.dump()
    assert admit(scripts, "e3", 5, check="", hold="a") == {"dup": 1}  # a retried commit
    assert scripts.dump() == before
    state = scripts.state("r1")
    assert (state["n"], state[f"a:{BUCKET}"]) == ("2", "2 6 1 5")
    assert client.xlen(OUTBOX) == 2


def test_a_sum_check_asks_for_the_value(scripts: Scripts, client: redis.Redis) -> None:
    snapshot(client, ST, credited=10, polar="1 4 4 4")  # 6 left
    assert admit(scripts, "e1", 6.5, check="sum") == {"no": [COUNT, "6", "0"]}
    assert "c" in admit(scripts, "e1", 6, check="sum")


def test_a_commit_releases_a_hold_in_a_hash_the_event_does_not_count_in(
    scripts: Scripts, client: redis.Redis
) -> None:
    other = state_key("r2")
    client.hset(other, mapping={"rev": "3", "h:a": f"1 {NOW + 9}"})
    reply = admit(scripts, "e1", 1, check="", hold="a", hold_key=other)
    assert [c["k"] for c in changes(json.dumps(reply))] == [ST, other]
    assert holds(scripts, other) == {}
    assert scripts.hash(other)["rev"] == "4"
    # After the hold expired and was pruned, a commit still records.
    assert "c" in admit(scripts, "e2", 1, check="", hold="a", hold_key=other)


def test_snapshots_and_confirms_keep_holds(scripts: Scripts, client: redis.Redis) -> None:
    snapshot(client, ST, credited=10)
    reserve(scripts, 3, "a")
    scripts.track("e1", {"r1": 1})
    scripts.apply_snapshot(
        {"r1": Aggregate.of([1])},
        cold_until=BUCKET + 300_000_000,
        as_of=BUCKET + 300_000_001,
        now=NOW,
        counted={"r1": [field(BUCKET, "e1")]},
        credited={COUNT: 9},
    )
    scripts.settle("confirm", {"r1": [field(BUCKET, "e1")]})
    assert holds(scripts) == {"h:a": f"3 {NOW + 1000}"}
