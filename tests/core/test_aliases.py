"""One customer, two names: a read of a customer counts the pending events
tracked under its other reference forms, which Polar names in every snapshot (``aliases``).
Against an in-memory Polar peer; Redis's answers are given by hand."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from outpost_core import (
    Balance,
    ChangePublished,
    ConfigurationReceived,
    Customer,
    IdentityLoaded,
    LoadIdentity,
    RunScript,
    ScriptReplied,
    Session,
    SubscriberLost,
    SubscriberRestarted,
    Tick,
    UsageError,
)
from outpost_core import _keys as keys
from outpost_core._balance import merged_state
from outpost_core._effects import Effect, Fetch, ListPending, OpenConnection
from outpost_core._inputs import BytesReceived, ConnectionOpened, PendingListed
from outpost_core._link import Link, Target
from outpost_core._mirror import derive_state
from outpost_core._snapshots import MalformedSnapshot, parse_snapshot
from tests.core._payloads import COUNT, configuration, reducer
from tests.core._polar import FixedRandom, Peer

UUID = "9f0c1d2e-3b4a-4c5d-8e6f-708192a3b4c5"
E = Customer("external", "c1")
X = Customer("customer", UUID)
CONFIG = configuration(reducer("r-count", [COUNT]))
COLD = 1_796_223_600_000_000
BUCKET = 300_000_000
WALL = COLD + 3 * BUCKET


def key(customer: Customer) -> str:
    return keys.state_key(customer, "r-count")


def agg(count: int) -> str:
    return f"{count} {count} 1 1" if count else "0 0 - -"


def state_hash(
    rev: int,
    *,
    polar: int | None = None,
    cold_until: int = COLD,
    as_of: int = COLD + 1,
    credited: float = 100,
    local: int = 0,
    sid: str = "s",
) -> dict[str, str]:
    """A state hash as the scripts write it: a snapshot (``polar`` not None) and ``local``
    pending events in the bucket at ``cold_until``."""
    fields = {"rev": str(rev), "n": str(local), "u": "0"}
    if polar is not None:
        fields |= {"cu": str(cold_until), "sa": str(as_of), "sid": sid, "p": agg(polar)}
        fields[f"c:{COUNT}"] = str(credited)
    if local:
        fields[f"a:{cold_until}"] = agg(local)
    return fields


def change(customer: Customer, fields: Mapping[str, str]) -> str:
    flat = [item for pair in fields.items() for item in pair]
    return json.dumps({"c": [{"k": key(customer), "r": int(fields["rev"]), "s": flat, "full": 1}]})


def snapshot_payload(customer: Customer, request_id: str | None, **fields: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "request_id": request_id,
        "snapshot_id": "s1",
        "as_of": COLD + 1,
        "cold_until": COLD,
        "reducers": {"r-count": {"count": 2, "sum": 2, "min": 1, "max": 1}},
        "credited": {COUNT: 100},
        **customer.wire(),
    }
    payload.update(fields)
    return payload


class Polar:
    """A session with a link and Polar's peer; Redis's effects are kept for the test to answer."""

    def __init__(self) -> None:
        self.session = Session(
            link=Link(Target(host="polar.test", port=443, tls=True), "tok", FixedRandom())
        )
        self.session.handle(ConfigurationReceived(CONFIG, from_cache=True))
        self.peer = Peer()
        self.redis: list[Effect] = []
        self.session.handle(Tick(1.0, WALL))
        assert self.drain() == [OpenConnection(host="polar.test", port=443, tls=True)]
        self.session.handle(ConnectionOpened(1.0))
        self.drain()
        self.session.handle(BytesReceived(1.0, self.peer.accept()))
        self.session.handle(SubscriberRestarted())
        self.drain()
        self.peer.take()

    def drain(self) -> list[Effect]:
        out = self.peer.receive(self.session.effects())
        self.redis += out
        return out

    def requests(self) -> dict[str, str]:
        """The snapshot requests sent since the last look: identity tag → request id."""
        self.drain()
        out = {}
        for message in self.peer.take():
            assert message["type"] == "snapshot"
            payload = message["payload"]
            name = "external" if "external_customer_id" in payload else "customer"
            ident = payload.get("external_customer_id") or payload["customer_id"]
            out[f"{name}:{ident}"] = payload["request_id"]
        return out

    def load(self, customer: Customer, fields: Mapping[str, str]) -> None:
        self.drain()
        loads = [e for e in self.redis if isinstance(e, LoadIdentity) and e.key == key(customer)]
        assert loads, f"no load of {customer}"
        self.redis.remove(loads[-1])
        self.session.handle(IdentityLoaded(key(customer), fields, loads[-1].load_id))
        self.drain()

    def snapshot(self, customer: Customer, request_id: str | None, after: Mapping[str, str],
                 **fields: Any) -> None:  # fmt: skip
        """Polar sends a snapshot; the flow lists no pending event and applies it, and the
        script's reply leaves the state hash as ``after``."""
        payload = snapshot_payload(customer, request_id, **fields)
        self.session.handle(
            BytesReceived(1.0, self.peer.send({"type": "snapshot", "payload": payload}))
        )
        self.drain()
        [listing] = [e for e in self.redis if isinstance(e, ListPending)]
        self.redis.remove(listing)
        self.session.handle(PendingListed(listing.tag, {k: [] for k in listing.keys}))
        self.drain()
        [apply] = [e for e in self.redis if isinstance(e, RunScript)]
        self.redis.remove(apply)
        assert apply.keys[0] == key(customer)
        self.session.handle(ScriptReplied(change(customer, after), apply.tag))
        self.drain()

    def read(self, external: str | None = "c1", customer: str | None = None, **kw: Any) -> Any:
        found = self.session.read(COUNT, external, customer, **kw)
        self.drain()
        return found


def alias_named(local: int = 0) -> Polar:
    """E read and loaded; its snapshot (revision 1, ``local`` pending events) names X, whose
    copy is not loaded yet."""
    polar = Polar()
    assert polar.read() is None
    [request] = polar.requests().values()
    polar.load(E, {"rev": "0"})
    polar.snapshot(E, request, state_hash(1, polar=2, local=local), aliases={"customer_id": UUID})
    return polar


def ready_with_alias(x_fields: Mapping[str, str]) -> tuple[Polar, Balance]:
    """E read, its snapshot names X, X's copy loads with ``x_fields``; the read's balance."""
    polar = alias_named(local=1)
    assert polar.read() is None, "X's copy is not loaded yet"
    polar.load(X, x_fields)
    balance = polar.read()
    assert isinstance(balance, Balance)
    return polar, balance


# -- parsing ---------------------------------------------------------------------------------


def test_aliases_are_parsed_and_absent_means_none() -> None:
    assert parse_snapshot(snapshot_payload(E, "r")).aliases == ()
    assert parse_snapshot(snapshot_payload(E, "r", aliases={})).aliases == ()
    shown_as_external = snapshot_payload(E, "r", aliases={"customer_id": UUID})
    assert parse_snapshot(shown_as_external).aliases == (X,)
    shown_as_id = snapshot_payload(X, "r", aliases={"external_customer_id": "c1"})
    assert parse_snapshot(shown_as_id).aliases == (E,)
    # One spelling per customer, the one track() and balance() key a customer_id by.
    upper = snapshot_payload(E, "r", aliases={"customer_id": UUID.upper().replace("-", "")})
    assert parse_snapshot(upper).aliases == (X,)


@pytest.mark.parametrize(
    "aliases",
    [
        ["customer_id", UUID],
        {"external_customer_id": "c2"},  # the snapshot's own form is not another one
        {"email": "a@b.c"},
        {1: UUID},
        {"customer_id": 7},
        {"customer_id": ""},
        {"customer_id": "not-a-uuid"},
    ],
)
def test_malformed_aliases_make_the_snapshot_a_counted_rejection(aliases: Any) -> None:
    with pytest.raises(MalformedSnapshot):
        parse_snapshot(snapshot_payload(E, "r", aliases=aliases))
    polar = Polar()
    polar.read()
    [request] = polar.requests().values()
    payload = snapshot_payload(E, request, aliases=aliases)
    polar.session.handle(
        BytesReceived(1.0, polar.peer.send({"type": "snapshot", "payload": payload}))
    )
    assert polar.session.rejections["snapshot"] == 1
    assert polar.session.remote is not None and polar.session.remote.aliases == {}


# -- the newest-totals rule ------------------------------------------------------------------


def test_the_newest_snapshot_gives_the_totals_and_every_name_its_pending_events() -> None:
    # S1 (E's, older) counts nothing; e1 is pending under E. S2 (X's, one bucket later) counts
    # e1 and x1, and removed x1 from X's pending. Polar's consumption is 2.
    s1 = derive_state(state_hash(3, polar=0, local=1, credited=10, sid="S1"))
    s2 = derive_state(state_hash(5, polar=2, cold_until=COLD + BUCKET, credited=20, sid="S2"))
    merged = merged_state(s1, [s2])
    # S1's totals would count x1 nowhere: 0 + 1 < 2, a balance above Polar's.
    assert s1.polar.merge(s1.local).merge(s2.local).count == 1
    # S2's totals count it; e1 is counted twice until E applies a snapshot as new (the safe side).
    assert (merged.polar.count, merged.local.count) == (2, 1)
    assert (merged.snapshot_id, merged.cold_until, merged.credits) == (
        "S2",
        COLD + BUCKET,
        {COUNT: 20},
    )
    assert (merged.revision, merged.pending) == (3, 1)
    # The other way round the same state wins: the rule does not depend on which name is read.
    assert merged_state(s2, [s1]).polar == merged.polar
    assert merged_state(s2, [s1]).local == merged.local


def test_equal_snapshots_keep_the_own_totals_and_a_later_as_of_wins() -> None:
    own = derive_state(state_hash(1, polar=1, sid="own"))
    same = derive_state(state_hash(1, polar=1, sid="other"))
    later = derive_state(state_hash(1, polar=2, as_of=COLD + 9, sid="later"))
    assert merged_state(own, [same]).snapshot_id == "own"
    assert merged_state(own, [later]).snapshot_id == "later"
    assert merged_state(own, []) is own


def test_a_name_without_a_snapshot_adds_its_pending_events_only() -> None:
    own = derive_state(state_hash(1, polar=2, local=1))
    bare = derive_state(state_hash(4, local=3) | {"a:x": "garbage"})
    merged = merged_state(own, [bare])
    assert (merged.polar.count, merged.local.count, merged.pending) == (2, 4, 4)
    assert merged.snapshot_id == "s" and merged.problems == ("a:x='garbage'",)


# -- the session -----------------------------------------------------------------------------


def test_a_read_waits_for_the_alias_copy_then_counts_its_pending_events() -> None:
    polar, balance = ready_with_alias(state_hash(7, local=2))
    assert (balance.polar.count, balance.local.count, balance.consumed) == (2, 3, 5)
    assert (balance.pending, balance.aliases, balance.revision) == (3, (X,), 1)
    assert polar.session.cached_balance(COUNT, "c1", None) is balance
    # The remote follows X: Polar is asked for X's snapshots, which clear X's pending events.
    assert list(polar.requests()) == [X.tag]


def test_the_remote_asks_for_the_alias_snapshots_when_the_alias_arrives() -> None:
    polar = alias_named()
    assert list(polar.requests()) == [X.tag]
    assert [e.key for e in polar.redis if isinstance(e, LoadIdentity)] == [key(X)]


def test_a_change_of_the_alias_copy_invalidates_the_cached_balance() -> None:
    polar, balance = ready_with_alias(state_hash(7, local=2))
    assert polar.session.cached_balance(COUNT, "c1", None) is balance
    after = state_hash(8, local=3)
    polar.session.handle(ChangePublished(change(X, after)))
    assert polar.session.cached_balance(COUNT, "c1", None) is None
    again = polar.read()
    assert isinstance(again, Balance) and again.consumed == 6


def test_a_newer_alias_snapshot_gives_the_totals_and_events_under_either_name_count() -> None:
    polar, _ = ready_with_alias(state_hash(7, local=2))
    x_request = polar.requests()[X.tag]
    # X's snapshot S2 (a bucket later) counts x1, x2 and e1 and cleared x1, x2 from X's pending.
    s2 = state_hash(8, polar=5, cold_until=COLD + BUCKET, credited=90, sid="S2")
    polar.snapshot(
        X, x_request, s2, cold_until=COLD + BUCKET, aliases={"external_customer_id": "c1"}
    )
    by_external = polar.read()
    assert isinstance(by_external, Balance)
    assert (by_external.snapshot_id, by_external.polar.count, by_external.local.count) == (
        "S2",
        5,
        1,
    )
    assert (by_external.credited, by_external.consumed) == (90, 6)
    by_id = polar.read(None, UUID)
    assert isinstance(by_id, Balance)
    assert (by_id.consumed, by_id.aliases, by_id.snapshot_id) == (6, (E,), "S2")


def test_an_alias_change_invalidates_and_an_empty_one_stops_the_merge() -> None:
    polar, balance = ready_with_alias(state_hash(7, local=2))
    assert balance.consumed == 5
    polar.session.handle(
        BytesReceived(
            1.0,
            polar.peer.send(
                {
                    "type": "snapshot",
                    "payload": snapshot_payload(E, None, aliases={}, as_of=COLD + 2),
                }
            ),
        )
    )
    assert polar.session.cached_balance(COUNT, "c1", None) is None
    polar.drain()
    alone = polar.read()
    assert isinstance(alone, Balance) and alone.aliases == () and alone.consumed == 3


def test_the_same_aliases_again_change_nothing() -> None:
    polar, balance = ready_with_alias(state_hash(7, local=2))
    payload = snapshot_payload(E, None, aliases={"customer_id": UUID}, as_of=COLD + 2)
    polar.session.handle(
        BytesReceived(1.0, polar.peer.send({"type": "snapshot", "payload": payload}))
    )
    assert polar.session.cached_balance(COUNT, "c1", None) is balance


def test_an_unasked_snapshot_records_aliases_but_follows_nothing() -> None:
    polar = Polar()
    payload = snapshot_payload(E, None, aliases={"customer_id": UUID})
    polar.session.handle(
        BytesReceived(1.0, polar.peer.send({"type": "snapshot", "payload": payload}))
    )
    assert polar.session.remote is not None and polar.session.remote.aliases == {E: (X,)}
    assert polar.requests() == {}
    assert not any(isinstance(e, LoadIdentity) for e in polar.redis)


def test_not_ready_names_the_alias_whose_copy_is_missing() -> None:
    polar = alias_named()
    reason = polar.session.not_ready_reason(COUNT, "c1", None)
    assert reason == f"the local state of {X} (another name of {E}) could not be loaded from Redis"
    polar.load(X, {"rev": "0"})
    assert "no snapshot from Polar" in polar.session.not_ready_reason(COUNT, "c1", None)


# -- reads that go to Redis ------------------------------------------------------------------


def test_a_fetch_names_both_keys_and_the_fields_of_both_count() -> None:
    polar, _ = ready_with_alias(state_hash(7, local=2))
    fetch = polar.read(fresh=True)
    assert fetch == Fetch(keys=(key(E), key(X)))
    fields = {key(E): state_hash(1, polar=2, local=1), key(X): state_hash(9, local=4)}
    balance = polar.session.read_fetched(COUNT, "c1", None, fields)
    assert isinstance(balance, Balance)
    assert (balance.source, balance.consumed, balance.aliases) == ("redis", 7, (X,))
    # The alias copy took the newer hash it read.
    assert [m.rev for m in polar.session.followed if m.key == key(X)] == [9]
    polar.session.handle(SubscriberLost())
    assert polar.read() == fetch  # not following: Redis, both keys


def test_read_fetched_needs_the_customer_hash_and_rereads_when_an_alias_is_missing() -> None:
    polar, _ = ready_with_alias(state_hash(7, local=2))
    with pytest.raises(UsageError, match="needs the fields"):
        polar.session.read_fetched(COUNT, "c1", None, {key(X): {}})
    # The aliases changed since the Fetch (it named E alone): not ready, read again.
    assert polar.session.read_fetched(COUNT, "c1", None, {key(E): state_hash(1, polar=2)}) is None


def test_a_fetched_hash_without_snapshot_asks_polar_again() -> None:
    polar, _ = ready_with_alias(state_hash(7, local=2))
    fields: dict[str, dict[str, str]] = {key(E): {}, key(X): {}}
    assert polar.session.read_fetched(COUNT, "c1", None, fields) is None


def test_without_a_link_there_are_no_aliases() -> None:
    session = Session()
    session.handle(ConfigurationReceived(CONFIG, from_cache=True))
    session.handle(SubscriberRestarted())
    assert session.read(COUNT, "c1") is None
    [load] = session.effects()
    assert isinstance(load, LoadIdentity)
    session.handle(IdentityLoaded(load.key, state_hash(1, polar=2, local=1), load.load_id))
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and (balance.aliases, balance.consumed) == ((), 3)
    assert session.read_fetched(COUNT, "c1", None, {load.key: state_hash(1, polar=2)}) is not None
