"""track.lua against a real Redis: reduce one event into each identity, queue it for delivery."""

from __future__ import annotations

import json
import math
import random
import struct
from typing import cast

import redis

from outpost_core import (
    Aggregate,
    Balance,
    ChangePublished,
    ConfigurationReceived,
    IdentityLoaded,
    LoadIdentity,
    ScriptReplied,
    Session,
    SubscriberRestarted,
)
from outpost_core._aggregate import format_number
from tests.lua._scripts import (
    BUCKET,
    CHANNEL,
    OUTBOX,
    B,
    Channel,
    Scripts,
    bucket_key,
    changes,
    field,
    pairs,
    state_key,
)
from tests.support.payloads import configuration, reducer

Entries = list[tuple[bytes, dict[bytes, bytes]]]


def outbox(client: redis.Redis) -> list[dict[str, str]]:
    entries = cast(Entries, client.xrange(OUTBOX))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


def test_first_write(scripts: Scripts, channel: Channel, client: redis.Redis) -> None:
    reply = scripts.track("e1", {"r1": 7})
    assert changes(reply) == [{"k": state_key("r1"), "r": 1}]  # known -1: key and revision only
    a = f"a:{BUCKET}"
    assert scripts.state("r1") == {"rev": "1", a: "1 7 7 7", "n": "1", "u": "1"}
    assert scripts.events("r1") == {field(BUCKET, "e1"): "7"}
    [published] = channel.published()
    assert changes(published) == [
        {"k": state_key("r1"), "r": 1, "s": [a, "1 7 7 7", "n", "1", "u", "1"], "d": []}
    ]
    [entry] = outbox(client)
    assert entry == {
        "e": json.dumps({"name": "api_call", "external_customer_id": "c1", "external_id": "e1"}),
        "f": field(BUCKET, "e1"),
        "k": json.dumps([state_key("r1")]),
    }
    scripts.check("r1")


def test_ttls_on_both_hashes(scripts: Scripts) -> None:
    scripts.track("e1", {"r1": 1})
    scripts.check_ttls("r1")


def test_aggregates_accumulate_per_bucket(scripts: Scripts) -> None:
    scripts.track("e1", {"r1": 5})
    scripts.track("e2", {"r1": -2.5})
    scripts.track("e3", {"r1": 9})
    scripts.track("e4", {"r1": 0.1}, bucket=BUCKET + B)
    scripts.track("e5", {"r1": 0.2}, bucket=BUCKET + B)
    state = scripts.state("r1")
    assert state["rev"] == "5"
    assert state[f"a:{BUCKET}"] == "3 11.5 -2.5 9"
    assert state[f"a:{BUCKET + B}"] == "2 0.30000000000000004 0.1 0.2"
    assert Aggregate.decode(state[f"a:{BUCKET + B}"]) == Aggregate.of([0.1, 0.2])
    assert (state["n"], state["u"]) == ("5", "5")
    scripts.check("r1")


def test_a_repeated_events_field_is_a_duplicate_and_writes_nothing(
    scripts: Scripts, channel: Channel
) -> None:
    scripts.track("e1", {"r1": 7, "r2": 1})
    channel.published()
    before = scripts.dump()
    assert scripts.track("e1", {"r1": 7, "r2": 1}) == '{"dup":1}'
    assert scripts.track("e1", {"r1": 100}) == '{"dup":1}'
    assert scripts.dump() == before
    assert channel.published() == []


def test_a_duplicate_is_detected_after_acknowledgement_too(scripts: Scripts) -> None:
    scripts.track("e1", {"r1": 7})
    scripts.settle("acknowledge", {"r1": [field(BUCKET, "e1")]}, now=BUCKET + 1)
    before = scripts.dump()
    assert scripts.track("e1", {"r1": 7}) == '{"dup":1}'
    assert scripts.dump() == before


def test_the_same_id_in_another_bucket_is_another_event(scripts: Scripts) -> None:
    scripts.track("e1", {"r1": 1})
    assert scripts.track("e1", {"r1": 1}, bucket=BUCKET + B) != '{"dup":1}'
    assert scripts.state("r1")["n"] == "2"
    scripts.check("r1")


def test_multiple_identities(scripts: Scripts, channel: Channel, client: redis.Redis) -> None:
    scripts.track("e0", {"r2": 1})  # r2 is one revision ahead
    channel.published()
    reply = scripts.track("e1", {"r1": 3, "r2": 4}, known={"r1": 0, "r2": 1})
    got = changes(reply)
    assert [(c["k"], c["r"]) for c in got] == [(state_key("r1"), 1), (state_key("r2"), 2)]
    # r1 did not exist: it starts from Redis's clock, not from the caller's revision 0, so the
    # caller gets the whole new state; r2's caller held the previous revision: a delta.
    assert got[0].get("full") == 1
    assert pairs(got[0]["s"]) == {"rev": "1", f"a:{BUCKET}": "1 3 3 3", "n": "1", "u": "1"}
    assert got[1]["s"] == [f"a:{BUCKET}", "2 5 1 4", "n", "2", "u", "2"]
    [published] = channel.published()
    deltas = changes(published)
    assert deltas[1] == got[1]
    assert deltas[0]["s"] == [f"a:{BUCKET}", "1 3 3 3", "n", "1", "u", "1"]
    entries = outbox(client)
    assert len(entries) == 2
    assert json.loads(entries[1]["k"]) == [state_key("r1"), state_key("r2")]
    assert entries[1]["f"] == field(BUCKET, "e1")
    for reducer_id in ("r1", "r2"):
        scripts.check(reducer_id)


def test_a_new_hash_starts_above_any_earlier_incarnation(
    scripts: Scripts, client: redis.Redis
) -> None:
    scripts.track("e1", {"r1": 1})
    first = int(client.hget(state_key("r1"), "rev") or 0)
    seconds, micros = client.time()
    assert abs(first - (seconds * 10_000 + micros // 100)) < 10_000 * 60  # Redis's clock
    assert len(str(first)) == 14  # written exactly by cjson and HSET
    client.delete(state_key("r1"), bucket_key("r1"))  # expired, or wiped
    scripts.track("e2", {"r1": 1})
    again = int(client.hget(state_key("r1"), "rev") or 0)
    assert again > first  # a copy that followed the old one sees a gap and reloads


def test_an_event_no_identity_counts_is_only_queued(
    scripts: Scripts, channel: Channel, client: redis.Redis
) -> None:
    assert changes(scripts.track("e1", {})) == []
    assert channel.published() == []
    assert [e["k"] for e in outbox(client)] == ["[]"]
    assert cast(list[bytes], client.keys("*")) == [OUTBOX.encode()]


def test_reply_modes_follow_the_known_revision(scripts: Scripts, channel: Channel) -> None:
    scripts.track("e1", {"r1": 1})
    scripts.track("e2", {"r1": 2})
    channel.published()
    # -1: the caller does not follow the identity.
    assert changes(scripts.track("e3", {"r1": 3}, known={"r1": -1})) == [
        {"k": state_key("r1"), "r": 3}
    ]
    # The previous revision: the delta, as published.
    delta = changes(scripts.track("e4", {"r1": 4}, known={"r1": 3}))
    assert delta == [
        {
            "k": state_key("r1"),
            "r": 4,
            "s": [f"a:{BUCKET}", "4 10 1 4", "n", "4", "u", "4"],
            "d": [],
        }
    ]
    # Any other revision: the whole state hash, marked full.
    for known in (0, 2, 9):
        rev = scripts.rev("r1") + 1
        [full] = changes(scripts.track(f"f{known}", {"r1": 1}, known={"r1": known}))
        assert (full["k"], full["r"], full["full"]) == (state_key("r1"), rev, 1)
        assert "d" not in full
        assert pairs(full["s"]) == scripts.state("r1")
    published = [changes(m) for m in channel.published()]
    assert published[1] == delta
    assert all("full" not in c for message in published for c in message)
    assert [message[0]["r"] for message in published] == [3, 4, 5, 6, 7]


def test_every_track_bumps_each_revision_by_one(scripts: Scripts, channel: Channel) -> None:
    for i in range(1, 6):
        reply = scripts.track(f"e{i}", {"r1": i, "r2": 1})
        assert [c["r"] for c in changes(reply)] == [i, i]
        assert (scripts.rev("r1"), scripts.rev("r2")) == (i, i)
    assert [[c["r"] for c in changes(m)] for m in channel.published()] == [
        [i, i] for i in range(1, 6)
    ]


def test_the_sessions_script_call_and_reply(scripts: Scripts, channel: Channel) -> None:
    """End to end with the core: its RunScript runs as is, and the reply updates its copy."""
    payload = configuration(reducer("r1", ["m"], func="sum", prop="tokens"))
    session = Session()
    session.handle(ConfigurationReceived(payload))
    session.handle(SubscriberRestarted())  # as a driver's subscriber confirms at start
    scripts.apply_snapshot(
        {"r1": Aggregate()}, cold_until=BUCKET, as_of=BUCKET + 1, now=BUCKET + 1, credited={"m": 50}
    )
    assert session.read("m", "c1") is None
    [load] = [e for e in session.effects() if isinstance(e, LoadIdentity)]
    fields = scripts.client.hgetall(state_key("r1"))
    session.handle(IdentityLoaded(state_key("r1"), fields, load.load_id))
    channel.published()
    run = session.track(
        name="api_call",
        external_customer_id="c1",
        metadata={"tokens": 12},
        timestamp_us=BUCKET + 5,
        now_us=BUCKET + 6,
        event_id="e1",
    )
    reply = scripts.run(run.script, run.keys, run.args)
    session.handle(ScriptReplied(reply))
    balance = session.read("m", "c1")
    assert isinstance(balance, Balance)
    assert (balance.consumed, balance.balance, balance.pending) == (12, 38, 1)
    [message] = channel.published()
    session.handle(ChangePublished(message.encode()))
    assert session.effects() == [] and session.rejections == {}
    assert run.args[0] == CHANNEL
    scripts.check("r1")


def test_a_retry_after_the_configuration_changed_does_not_count_twice(scripts: Scripts) -> None:
    """Driver retries reuse the event id; a meter created meanwhile puts a new reducer first."""
    scripts.track("e1", {"r2": 5})
    scripts.settle("acknowledge", {"r2": [field(BUCKET, "e1")]}, now=BUCKET + 1)
    scripts.track("e1", {"r1": 5, "r2": 5})
    scripts.check("r1")
    assert scripts.events("r2") == {field(BUCKET, "e1"): f"5 {BUCKET + 1}"}
    scripts.check("r2")


def test_lua_writes_numbers_that_read_back_exactly(scripts: Scripts) -> None:
    """The scripts' number format (lib.lua fmt) and the core's agree on every finite double."""
    rng = random.Random(20261202)
    values = [-0.0, 0.1 + 0.2, 1 / 3, 1e-7, 5e-324, 1.7976931348623157e308, -1.5e300, 1e22]
    values += [2.0**53, 2.0**53 + 2, 2.0**63, 123456789.123, 9007199254740993.0]
    while len(values) < 400:
        value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(value):
            values.append(value)
    for i, value in enumerate(values):
        scripts.track(f"v{i}", {f"r{i}": format_number(value)})
        stored = scripts.state(f"r{i}")[f"a:{BUCKET}"]
        assert Aggregate.decode(stored) == Aggregate.of([value]), (value, stored)
