"""acknowledge.lua and confirm.lua against a real Redis."""

from __future__ import annotations

from typing import cast

import pytest
import redis

from tests.lua._scripts import (
    BUCKET,
    GROUP,
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

F1, F2, F3 = field(BUCKET, "e1"), field(BUCKET, "e2"), field(BUCKET, "e3")
LATER = field(BUCKET + B, "e4")
ACKED_AT = BUCKET + 10_000_000


def read_outbox(client: redis.Redis, count: int) -> list[str]:
    """Create the consumer group and read ``count`` entries, as a delivery loop does."""
    client.xgroup_create(OUTBOX, GROUP, id="0")
    read = cast(
        list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]],
        client.xreadgroup(GROUP, "consumer-1", {OUTBOX: ">"}, count=count),
    )
    ids = [entry_id.decode() for _, entries in read for entry_id, _ in entries]
    assert len(ids) == count
    return ids


def pending_count(client: redis.Redis) -> int:
    summary = client.xpending(OUTBOX, GROUP)
    return int(summary["pending"])


def track_three(scripts: Scripts) -> None:
    scripts.track("e1", {"r1": 5, "r2": 1})
    scripts.track("e2", {"r1": 9, "r2": 1})
    scripts.track("e3", {"r1": 2})
    scripts.track("e4", {"r1": 4}, bucket=BUCKET + B)


def tracked_and_read(scripts: Scripts, channel: Channel, client: redis.Redis) -> list[str]:
    """track_three, then a delivery loop reads the four outbox entries (their ids, returned);
    the messages published so far are drained."""
    track_three(scripts)
    ids = read_outbox(client, 4)
    channel.published()
    return ids


# -- acknowledge ----------------------------------------------------------------------------------


def test_acknowledge_marks_events_and_decrements_u_once(
    scripts: Scripts, channel: Channel, client: redis.Redis
) -> None:
    ids = tracked_and_read(scripts, channel, client)
    before = scripts.state("r1")
    reply = scripts.settle(
        "acknowledge", {"r1": [F1, F2], "r2": [F1, F2]}, ids=ids[:2], now=ACKED_AT
    )
    got = changes(reply)
    assert got == [{"k": state_key("r1"), "r": 5}, {"k": state_key("r2"), "r": 3}]
    assert scripts.events("r1") == {
        F1: f"5 {ACKED_AT}",
        F2: f"9 {ACKED_AT}",
        F3: "2",
        LATER: "4",
    }
    after = scripts.state("r1")
    assert after["u"] == "2" and after["n"] == "4"
    # Only u and rev change: the events still count in their buckets.
    assert {k: v for k, v in after.items() if k not in ("u", "rev")} == {
        k: v for k, v in before.items() if k not in ("u", "rev")
    }
    assert scripts.state("r2")["u"] == "0"
    published = [changes(m) for m in channel.published()]
    assert published == [
        [
            {"k": state_key("r1"), "r": 5, "s": ["u", "2"], "d": []},
            {"k": state_key("r2"), "r": 3, "s": ["u", "0"], "d": []},
        ]
    ]
    # The outbox entries are acknowledged in the group and deleted from the stream.
    assert client.xlen(OUTBOX) == 2
    assert pending_count(client) == 2
    for reducer_id in ("r1", "r2"):
        scripts.check(reducer_id)


def test_acknowledge_ignores_fields_that_are_not_pending(
    scripts: Scripts, channel: Channel
) -> None:
    scripts.track("e1", {"r1": 5})
    channel.published()
    reply = scripts.settle("acknowledge", {"r1": [field(BUCKET, "nope"), F1], "r2": [F1]})
    assert changes(reply) == [{"k": state_key("r1"), "r": 2}]
    assert scripts.state("r2") == {}
    assert len(channel.published()) == 1
    scripts.check("r1")


def test_acknowledge_counts_an_event_named_twice_in_one_call_once(scripts: Scripts) -> None:
    track_three(scripts)
    before = int(scripts.state("r1")["u"])
    scripts.settle("acknowledge", {"r1": [F1, F1, F2]}, now=ACKED_AT)
    assert int(scripts.state("r1")["u"]) == before - 2
    assert scripts.events("r1")[F1] == f"5 {ACKED_AT}"
    scripts.check("r1")


def test_acknowledge_of_more_events_than_one_command_takes(scripts: Scripts) -> None:
    many = [f"m{n}" for n in range(2500)]  # the script writes them in slices of 1,000
    for event_id in many:
        scripts.track(event_id, {"r1": 1})
    scripts.settle("acknowledge", {"r1": [field(BUCKET, e) for e in many]}, now=ACKED_AT)
    assert scripts.state("r1")["u"] == "0"
    assert all(value == f"1 {ACKED_AT}" for value in scripts.events("r1").values())
    scripts.check("r1")


def test_acknowledge_reply_modes(scripts: Scripts, channel: Channel) -> None:
    track_three(scripts)
    channel.published()
    [delta] = changes(scripts.settle("acknowledge", {"r1": [F1]}, known={"r1": 4}))
    assert delta == {"k": state_key("r1"), "r": 5, "s": ["u", "3"], "d": []}
    assert scripts.echo is None  # the reply is the published text itself
    [full] = changes(scripts.settle("acknowledge", {"r1": [F2]}, known={"r1": 1}))
    assert full["full"] == 1 and pairs(full["s"]) == scripts.state("r1")
    # Whole states carry every change: the reply comes with the published text, exactly.
    assert channel.published()[-1] == scripts.echo
    [bare] = changes(scripts.settle("acknowledge", {"r1": [F3]}, known={"r1": -1}))
    assert "s" not in bare and scripts.echo is None  # revisions only: the echo says more


def test_acknowledge_without_entry_ids_touches_no_stream(scripts: Scripts) -> None:
    scripts.track("e1", {"r1": 5})
    scripts.client.delete(OUTBOX)
    scripts.settle("acknowledge", {"r1": [F1]}, ids=[])
    assert scripts.client.exists(OUTBOX) == 0


def test_acknowledge_refreshes_the_ttls(scripts: Scripts, client: redis.Redis) -> None:
    scripts.track("e1", {"r1": 5})
    client.expire(state_key("r1"), 100)
    client.expire(bucket_key("r1"), 100)
    scripts.settle("acknowledge", {"r1": [F1]})
    scripts.check_ttls("r1")


# -- confirm --------------------------------------------------------------------------------------


def test_confirm_removes_events_and_rebuilds_the_bucket(
    scripts: Scripts, channel: Channel, client: redis.Redis
) -> None:
    ids = tracked_and_read(scripts, channel, client)
    assert scripts.state("r1")[f"a:{BUCKET}"] == "3 16 2 9"
    reply = scripts.settle("confirm", {"r1": [F2]}, ids=ids[1:2], known={"r1": 4})
    # The maximum left: the bucket's max falls back to the largest remaining value.
    [delta] = changes(reply)
    assert delta == {
        "k": state_key("r1"),
        "r": 5,
        "s": [f"a:{BUCKET}", "2 7 2 5", "n", "3", "u", "3"],
        "d": [],
    }
    assert scripts.state("r1")[f"a:{BUCKET}"] == "2 7 2 5"
    assert scripts.state("r1")[f"a:{BUCKET + B}"] == "1 4 4 4"
    assert F2 not in scripts.events("r1")
    assert [changes(m) for m in channel.published()] == [[delta]]
    assert client.xlen(OUTBOX) == 3
    assert pending_count(client) == 3
    scripts.check("r1")


def test_confirm_of_the_minimum(scripts: Scripts) -> None:
    track_three(scripts)
    scripts.settle("confirm", {"r1": [F3]})
    assert scripts.state("r1")[f"a:{BUCKET}"] == "2 14 5 9"
    scripts.check("r1")


def test_confirm_deletes_the_aggregate_of_an_emptied_bucket(
    scripts: Scripts, channel: Channel
) -> None:
    track_three(scripts)
    channel.published()
    [change] = changes(scripts.settle("confirm", {"r1": [LATER]}))
    assert change == {"k": state_key("r1"), "r": 5}
    assert f"a:{BUCKET + B}" not in scripts.state("r1")
    [published] = [changes(m) for m in channel.published()]
    assert published == [
        {"k": state_key("r1"), "r": 5, "s": ["n", "3", "u", "3"], "d": [f"a:{BUCKET + B}"]}
    ]
    scripts.check("r1")


def test_confirm_counts_acknowledged_and_unacknowledged_events_right(scripts: Scripts) -> None:
    track_three(scripts)
    scripts.settle("acknowledge", {"r1": [F1, F2]}, now=ACKED_AT)
    assert (scripts.state("r1")["n"], scripts.state("r1")["u"]) == ("4", "2")
    scripts.settle("confirm", {"r1": [F1, F3]})  # one acknowledged, one not
    state = scripts.state("r1")
    assert (state["n"], state["u"]) == ("2", "1")
    assert state[f"a:{BUCKET}"] == "1 9 9 9"
    scripts.check("r1")


@pytest.mark.parametrize(
    ("script", "fields", "entries"),
    [
        ("acknowledge", {"r1": [F1]}, [0]),
        ("confirm", {"r1": [F1, LATER], "r2": [F1]}, [0, 3]),
    ],
)
def test_settling_twice_changes_nothing_the_second_time(
    script: str,
    fields: dict[str, list[str]],
    entries: list[int],
    scripts: Scripts,
    channel: Channel,
    client: redis.Redis,
) -> None:
    """The second settlement of the same events and entries writes nothing (a later ``now``
    does not move an acknowledgement time)."""
    track_three(scripts)
    read = read_outbox(client, 4)
    ids = [read[i] for i in entries]
    scripts.settle(script, fields, ids=ids, now=ACKED_AT)
    channel.published()
    before = scripts.dump()
    reply = scripts.settle(script, fields, ids=ids, now=ACKED_AT + 5)
    assert changes(reply) == []
    assert scripts.dump() == before
    assert channel.published() == []
    for reducer_id in fields:
        scripts.check(reducer_id)


def test_confirm_of_every_event(scripts: Scripts) -> None:
    track_three(scripts)
    scripts.settle("confirm", {"r1": [F1, F2, F3, LATER], "r2": [F1, F2]})
    for reducer_id, rev in (("r1", 5), ("r2", 3)):
        assert scripts.state(reducer_id) == {"rev": str(rev), "n": "0", "u": "0"}
        assert scripts.events(reducer_id) == {}
        scripts.check(reducer_id)


@pytest.mark.parametrize("script", ["acknowledge", "confirm"])
def test_each_identity_bumps_its_revision_once_per_call(scripts: Scripts, script: str) -> None:
    track_three(scripts)
    revs = (scripts.rev("r1"), scripts.rev("r2"))
    reply = scripts.settle(script, {"r1": [F1, F2, F3], "r2": [F1, F2]})
    assert [c["r"] for c in changes(reply)] == [revs[0] + 1, revs[1] + 1]
    assert (scripts.rev("r1"), scripts.rev("r2")) == (revs[0] + 1, revs[1] + 1)
    for reducer_id in ("r1", "r2"):
        scripts.check(reducer_id)


@pytest.mark.parametrize("script", ["acknowledge", "confirm"])
def test_settling_a_large_batch(scripts: Scripts, client: redis.Redis, script: str) -> None:
    client.xgroup_create(OUTBOX, GROUP, id="0", mkstream=True)
    pipe = client.pipeline()
    for _ in range(8000):
        pipe.xadd(OUTBOX, {"e": "{}"})
    ids = [entry_id.decode() for entry_id in pipe.execute()]
    client.xreadgroup(GROUP, "consumer-1", {OUTBOX: ">"}, count=len(ids))
    scripts.settle(script, {}, ids=ids)
    assert client.xlen(OUTBOX) == 0
