"""Following a bounded number of customers: letting go of the least recently read and the idle
ones (Polar told to forget them), a re-read after that, deadlines in a heap, and reconnects and
restarted subscriptions that reload only the recently read customers, at a pace."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outpost_core import (
    Balance,
    ChangePublished,
    Customer,
    Fetch,
    IdentityLoaded,
    LoadIdentity,
    RunScript,
    ScriptReplied,
    Settings,
    SubscriberRestarted,
    Tick,
    UsageError,
)
from outpost_core import _keys as keys
from outpost_core._deadlines import Deadlines
from outpost_core._effects import Effect, ListPending, OpenConnection
from outpost_core._following import Following, Pacer
from outpost_core._inputs import BytesReceived, ConnectionOpened, PendingListed, SubscriberLost
from outpost_core._link import LinkSettings
from tests.core._payloads import COUNT
from tests.core._polar import Peer, snapshot_message
from tests.core.test_remote import HOT, WALL, Polar
from tests.core.test_session import configured

FIELDS = {"rev": "4", "cu": str(HOT), "sa": str(WALL - 1), "sid": "snap-0", "p": "3 3 1 1"}
FIELDS[f"c:{COUNT}"] = "10"


def key(name: str) -> str:
    return keys.state_key(Customer("external", name), "r-count")


class Bounded(Polar):
    """A session with a link and many customers, each followed the way a driver does it."""

    def read(self, name: str) -> Balance | Fetch | None:
        return self.session.read(COUNT, name)

    def answer(self, effects: list[Effect], fields: dict[str, str] | None = None) -> list[Effect]:
        """Answer the loads among ``effects`` with ``fields``; return the rest."""
        rest: list[Effect] = []
        for effect in effects:
            if isinstance(effect, LoadIdentity):
                answer = fields if fields is not None else FIELDS
                self.session.handle(IdentityLoaded(effect.key, answer, effect.load_id))
            else:
                rest.append(effect)
        return rest

    def apply(self, name: str, request_id: str | None, snapshot_id: str = "snap-1") -> None:
        """Polar answers ``name``'s request and Redis applies the snapshot."""
        payload = {
            "request_id": request_id,
            "snapshot_id": snapshot_id,
            "external_customer_id": name,
            "as_of": WALL - 1,
            "cold_until": HOT,
            "reducers": {"r-count": {"count": 3, "sum": 3, "min": 1, "max": 1}},
            "credited": {COUNT: 10},
        }
        [listed] = self.send({"type": "snapshot", "payload": payload})
        assert isinstance(listed, ListPending)
        self.session.handle(PendingListed(listed.tag, {}))
        [run] = self.effects()
        assert isinstance(run, RunScript) and run.tag is not None
        change = {"k": key(name), "r": 5, "s": ["sid", snapshot_id], "d": {}}
        self.session.handle(ScriptReplied(json.dumps({"c": [change]}), tag=run.tag))
        assert self.effects() == []

    def first_read(self, name: str) -> None:
        assert self.read(name) is None
        assert self.answer(self.effects()) == []
        [request] = [m for m in self.peer.take() if m["type"] == "snapshot"]
        assert request == {
            "type": "snapshot",
            "payload": {
                "request_id": request["payload"]["request_id"],
                "external_customer_id": name,
            },
        }
        self.apply(name, request["payload"]["request_id"])
        assert isinstance(self.read(name), Balance)

    def followed(self) -> set[str]:
        return {m.customer.id for m in self.session.followed}


def bounded(**settings: Any) -> Bounded:
    quiet = LinkSettings(ping_interval=1e9, dead_after=1e9)  # the clock jumps far here
    polar = Bounded(Settings(**settings), quiet).connect()
    return polar


def test_settings_are_checked() -> None:
    for bad in (0, 1.5, True):
        with pytest.raises(UsageError, match="max_customers"):
            Settings(max_customers=bad)  # type: ignore[arg-type]
    for name in ("idle_customer_ttl", "recent_window", "reload_rate"):
        with pytest.raises(UsageError, match=name):
            Settings(**{name: 0.0})  # type: ignore[arg-type]


def test_the_least_recently_read_customer_is_let_go_and_polar_told_to_forget_it() -> None:
    polar = bounded(max_customers=2)
    polar.first_read("a")
    polar.first_read("b")
    assert isinstance(polar.read("a"), Balance)  # a is now the most recent
    polar.first_read("c")  # b goes
    assert polar.followed() == {"a", "c"}
    # (The forget went out before c's request.)
    assert polar.session.remote is not None
    assert set(polar.session.remote.flows) == {Customer("external", "a"), Customer("external", "c")}
    assert polar.session.cached_balance(COUNT, "b", None) is None
    assert "b" not in polar.session.warm


def test_forget_is_sent_to_polar() -> None:
    polar = bounded(max_customers=1)
    polar.first_read("a")
    assert polar.read("b") is None
    polar.answer(polar.effects())
    forget = {"type": "forget", "payload": {"external_customer_id": "a"}}
    assert polar.peer.take()[1] == forget  # after b's request
    assert polar.followed() == {"b"}
    # A late answer to a's load or a change of a's hash is ignored.
    polar.session.handle(IdentityLoaded(key("a"), FIELDS, 1))
    change = {"k": key("a"), "r": 9, "s": ["n", "1"], "d": {}}
    polar.session.handle(ChangePublished(json.dumps({"c": [change]})))
    assert polar.followed() == {"b"}


def test_a_customer_let_go_is_read_again_from_redis_at_once() -> None:
    polar = bounded(max_customers=1)
    polar.first_read("a")
    polar.first_read("b")  # a goes
    polar.peer.take()
    # Read again: one load, and the answer without waiting for Polar (a snapshot is asked).
    assert polar.read("a") is None
    assert polar.answer(polar.effects()) == []
    messages = polar.peer.take()
    assert [m["type"] for m in messages] == ["snapshot", "forget"]  # (b goes)
    balance = polar.read("a")
    assert isinstance(balance, Balance) and balance.consumed == 3.0 and balance.balance == 7.0


def test_a_customer_never_followed_still_waits_for_polar() -> None:
    polar = bounded(max_customers=1)
    assert polar.read("a") is None
    polar.answer(polar.effects())
    assert polar.read("a") is None  # Redis holds a snapshot, but this process knows no aliases


def snapshot_of_a(request: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Polar's answer to ``request``, a's snapshot: 3 calls counted, 10 credited."""
    counted = {"r-count": {"count": 3, "sum": 3, "min": 1, "max": 1}}
    return snapshot_message(
        request["payload"]["request_id"],
        "a",
        as_of=WALL - 1,
        cold_until=HOT,
        reducers=counted,
        credited={COUNT: 10},
        **extra,
    )


def test_the_aliases_of_a_customer_let_go_are_kept_for_its_next_read() -> None:
    polar = bounded(max_customers=3)
    assert polar.read("a") is None
    polar.answer(polar.effects())
    [request] = polar.peer.take()
    internal = "0b7e5a3c-6f6b-4a6e-9d47-0b1f9c4f0a11"
    effects = polar.send(snapshot_of_a(request, aliases={"customer_id": internal}))
    polar.answer(effects)  # the alias's copy loads (the listing waits)
    assert polar.session.remote is not None
    alias = Customer("customer", internal)
    assert polar.session.remote.aliases[Customer("external", "a")] == (alias,)
    polar.tick(polar.now)  # a's read gave up waiting (a wait dates from the tick after it)
    polar.tick(polar.now + 10.0)
    for name in ("b", "c", "d"):  # a and its alias go
        polar.read(name)
        polar.answer(polar.effects())
    assert "a" not in polar.followed()
    assert polar.read("a") is None
    polar.answer(polar.effects())
    assert polar.session.remote.aliases[Customer("external", "a")] == (alias,)


def test_customers_let_go_are_remembered_up_to_the_bound() -> None:
    polar = bounded(max_customers=1)
    for name in ("a", "b", "c"):
        polar.read(name)
        polar.answer(polar.effects())
        polar.tick(polar.now + 10.0)  # its read gave up waiting
    assert list(polar.session._let_go) == [Customer("external", "b")]


def test_a_customer_whose_read_waits_is_not_let_go() -> None:
    polar = bounded(max_customers=1)
    assert polar.read("a") is None  # waits for its load
    assert polar.read("b") is None
    assert polar.followed() == {"a", "b"}  # over the bound for as long as a's read waits
    polar.answer(polar.effects())
    polar.tick(polar.now + Settings().snapshot_timeout + 2.0)
    assert polar.followed() == {"b"}


def test_a_fetch_in_flight_keeps_its_customer() -> None:
    polar = bounded(max_customers=1)
    polar.first_read("a")
    polar.session.handle(SubscriberLost())
    assert isinstance(polar.session.read(COUNT, "a"), Fetch)
    assert polar.read("b") is None
    assert "a" in polar.followed()
    balance = polar.session.read_fetched(COUNT, "a", None, {key("a"): FIELDS})
    assert isinstance(balance, Balance)


def test_a_customer_kept_busy_by_warm_reads_is_not_let_go() -> None:
    polar = bounded(max_customers=2)
    polar.first_read("a")
    polar.first_read("b")
    assert polar.session.cached_balance(COUNT, "a", None) is not None  # a warm read of a
    polar.first_read("c")
    assert polar.followed() == {"a", "c"}


def test_an_idle_customer_is_let_go() -> None:
    polar = bounded(idle_customer_ttl=100.0)
    polar.first_read("a")
    polar.tick(polar.now + 50.0)
    polar.first_read("b")
    start = polar.now
    assert polar.session.next_deadline() == start + 100.0  # a, stamped by the connect's tick
    polar.tick(start + 99.0)
    assert polar.followed() == {"a", "b"}
    polar.tick(start + 100.0)
    assert polar.followed() == {"b"}
    assert polar.peer.take()[-1]["type"] == "forget"


def test_a_read_between_ticks_dates_from_the_next_tick() -> None:
    polar = bounded(idle_customer_ttl=100.0)
    polar.first_read("a")
    polar.tick(polar.now + 99.0)
    assert isinstance(polar.read("a"), Balance)  # read at 1 + 99.x: not idle until 199
    polar.tick(polar.now + 1.0)
    assert polar.followed() == {"a"}


def test_a_customer_let_go_while_its_snapshot_applies_ignores_the_late_reply() -> None:
    polar = bounded(max_customers=1)
    assert polar.read("a") is None
    polar.answer(polar.effects())
    [request] = polar.peer.take()
    [listed] = polar.send(snapshot_of_a(request))
    assert isinstance(listed, ListPending)
    polar.tick(polar.now)  # (a wait dates from the tick after the read)
    polar.tick(polar.now + Settings().snapshot_timeout + 2.0)  # a's read gave up
    polar.read("b")
    polar.answer(polar.effects())
    assert polar.followed() == {"b"}
    polar.session.handle(PendingListed(listed.tag, {}))
    assert polar.effects() == []
    assert polar.session.next_deadline() is not None


def reconnect(polar: Polar) -> list[dict[str, Any]]:
    """Polar hangs up; the session reconnects after the backoff; what it asks at once."""
    polar.session.handle(BytesReceived(polar.now, b""))
    polar.effects()
    polar.peer = Peer()
    polar.now = polar.link.retry_at
    polar.session.handle(Tick(polar.now, WALL))
    polar.effects()
    polar.session.handle(ConnectionOpened(polar.now))
    polar.effects()
    polar.session.handle(BytesReceived(polar.now, polar.peer.accept()))
    polar.effects()
    return polar.peer.take()[1:]  # (after the configuration)


def asked(messages: list[dict[str, Any]]) -> list[str]:
    return [m["payload"]["external_customer_id"] for m in messages if m["type"] == "snapshot"]


def test_a_reconnect_asks_at_once_only_for_recent_customers_at_the_pace() -> None:
    polar = bounded(recent_window=30.0, reload_rate=2.0)
    for name in ("old1", "old2"):
        polar.first_read(name)
    polar.tick(polar.now)  # (a read dates from the tick after it)
    polar.tick(polar.now + 60.0)
    for name in ("r1", "r2", "r3"):
        polar.first_read(name)
    polar.tick(polar.now + 1.0)
    assert asked(reconnect(polar)) == ["r3", "r2"]  # most recent first, two a second
    deadline = polar.session.next_deadline()
    assert deadline == polar.now + 0.5
    polar.tick(deadline)
    assert asked(polar.peer.take()) == ["r1"]
    polar.tick(polar.now + 10.0)
    assert polar.peer.take() == []  # the old ones wait for a read
    assert isinstance(polar.read("old1"), Balance)  # the copy answers; Polar is asked
    polar.effects()
    assert asked(polar.peer.take()) == ["old1"]


def test_a_reconnect_asks_at_once_for_snapshots_a_read_waits_for() -> None:
    polar = bounded()
    assert polar.read("a") is None
    polar.answer(polar.effects())
    polar.peer.take()
    polar.tick(polar.now + 120.0)
    assert asked(reconnect(polar)) == ["a"]


def test_a_disconnect_drops_the_paced_requests() -> None:
    polar = bounded(reload_rate=1.0)
    for name in ("a", "b"):
        polar.first_read(name)
    assert asked(reconnect(polar)) == ["b"]
    polar.session.handle(BytesReceived(polar.now, b""))
    polar.effects()
    assert polar.session.remote is not None and not polar.session.remote._asks


def test_a_restarted_subscription_reloads_only_recent_copies_at_the_pace() -> None:
    polar = bounded(recent_window=30.0, reload_rate=1.0)
    polar.first_read("old")
    polar.tick(polar.now)  # (a read dates from the tick after it)
    polar.tick(polar.now + 60.0)
    polar.first_read("r1")
    polar.first_read("r2")
    polar.tick(polar.now + 1.0)
    polar.session.handle(SubscriberRestarted())
    [load] = polar.effects()
    assert isinstance(load, LoadIdentity) and load.key == key("r2")
    polar.answer([load])
    assert polar.session.next_deadline() == polar.now + 1.0
    [load] = polar.tick(polar.now + 1.0)
    assert isinstance(load, LoadIdentity) and load.key == key("r1")
    polar.answer([load])
    assert polar.tick(polar.now + 1.0) == []
    # The old copy no longer answers from memory: its read goes to Redis and reloads it.
    fetch = polar.read("old")
    assert isinstance(fetch, Fetch) and fetch.keys == (key("old"),)
    [load] = polar.effects()
    assert isinstance(load, LoadIdentity) and load.key == key("old")


def test_a_reload_queued_for_a_copy_read_meanwhile_is_skipped() -> None:
    polar = bounded(reload_rate=1.0)
    polar.first_read("a")
    polar.first_read("b")
    polar.session.handle(SubscriberRestarted())
    [load] = polar.effects()
    assert isinstance(load, LoadIdentity) and load.key == key("b")
    assert isinstance(polar.read("a"), Fetch)  # a reloads now
    polar.answer(polar.effects())
    assert polar.tick(polar.now + 1.0) == []  # its queued reload is not needed any more


def test_a_load_asked_before_the_subscription_confirms_is_asked_again() -> None:
    polar = bounded()
    polar.session.handle(SubscriberLost())
    assert polar.read("a") is None
    polar.effects()
    polar.peer.take()
    polar.session.handle(SubscriberRestarted())
    [load] = polar.effects()
    assert isinstance(load, LoadIdentity) and load.key == key("a")


def test_a_deadline_left_by_a_dropped_connection_does_nothing() -> None:
    polar = bounded()
    assert polar.read("a") is None
    polar.answer(polar.effects())
    polar.peer.take()
    polar.session.handle(BytesReceived(polar.now, b""))  # dropped: the request is forgotten
    polar.effects()
    polar.session.handle(Tick(polar.now + 6.0, WALL))  # past the request's timeout
    polar.session.handle(Tick(polar.now + 6.0, WALL))
    assert [e for e in polar.session.effects() if not isinstance(e, OpenConnection)] == []


def test_a_session_without_a_link_lets_go_too() -> None:
    session = configured(settings=Settings(max_customers=1))
    for name in ("a", "b"):
        assert session.read(COUNT, name) is None
        [load] = session.effects()
        assert isinstance(load, LoadIdentity)
        session.handle(IdentityLoaded(load.key, FIELDS, load.load_id))
        assert isinstance(session.read(COUNT, name), Balance)
    assert {m.customer.id for m in session.followed} == {"b"}
    assert session.effects() == []


def test_deadlines() -> None:
    deadlines: Deadlines[str] = Deadlines()
    deadlines.set("a", 2.0)
    deadlines.set("a", 2.0)
    deadlines.set("b", 1.0)
    assert len(deadlines) == 2 and "a" in deadlines and deadlines.get("b") == 1.0
    deadlines.set("b", None)
    deadlines.cancel("nothing")
    assert deadlines.next() == 2.0
    for i in range(200):  # rescheduled often: the heap stays small
        deadlines.set("a", 3.0 + i)
    assert len(deadlines._heap) <= 2 * len(deadlines) + 65
    assert deadlines.pop_due(10.0) == []
    assert deadlines.pop_due(1000.0) == ["a"]
    assert deadlines.next() is None


def test_following_and_pacer() -> None:
    following = Following()
    assert following.oldest() is None
    a, b = Customer("external", "a"), Customer("external", "b")
    following.add(a, 1.0)
    following.add(b, 1.0)
    following.stamp(5.0)
    assert b in following and len(following) == 2
    assert list(following.recent(5.0)) == [b, a] and list(following.recent(6.0)) == []
    following.reading(a, 1.0)
    assert following.pinned(a, 100.0)  # until stamped
    following.stamp(10.0)
    assert following.pinned(a, 10.5) and not following.pinned(a, 11.0)
    following.drop(a)
    following.stamp(12.0)  # (a dropped meanwhile)
    pacer = Pacer(2.0)
    assert pacer.next_at(0.0) == 0.0
    assert pacer.take(0.0, 5) == 2
    assert pacer.next_at(0.0) == 0.5
    assert pacer.take(0.25, 5) == 0
    assert pacer.take(10.0, 5) == 2
    slow = Pacer(0.5)  # slower than one a second: one at a time, every two seconds
    assert slow.take(0.0, 5) == 1
    assert slow.next_at(0.0) == 2.0
    assert slow.take(1.0, 5) == 0
    assert slow.take(2.0, 5) == 1


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["read", "answer", "tick"]), st.integers(0, 5)),
        max_size=40,
    )
)
def test_eviction_never_drops_a_waiting_read_and_rereads_are_correct(
    steps: list[tuple[str, int]],
) -> None:
    polar = bounded(max_customers=2, idle_customer_ttl=30.0)
    waiting: set[str] = set()
    for action, i in steps:
        name = f"c{i}"
        if action == "read":
            answer = polar.read(name)
            if answer is None:
                waiting.add(name)
            else:
                assert isinstance(answer, Balance) and answer.balance == 7.0
                waiting.discard(name)
        elif action == "answer":
            polar.answer(polar.effects())
            for message in polar.peer.take():
                if message["type"] == "snapshot":
                    customer = message["payload"]["external_customer_id"]
                    if customer in polar.followed():
                        polar.apply(customer, message["payload"]["request_id"])
        else:
            polar.tick(polar.now + 1.0 + i * 3.0)
            waiting = {
                w
                for w in waiting
                if polar.session._following.pinned(Customer("external", w), polar.now)
            }
        assert waiting <= polar.followed()
        assert len(polar.followed() - waiting) <= 2
