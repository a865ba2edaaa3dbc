"""The session with its WebSocket to Polar (``_remote``, ``_session``): snapshot flows end to end,
against an in-memory Polar peer. No socket, no Redis: effects are answered by hand."""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Self

import pytest

from outpost_core import (
    Balance,
    Closing,
    ConfigurationReceived,
    Customer,
    Fetch,
    IdentityLoaded,
    LoadFailed,
    LoadIdentity,
    RunScript,
    ScriptReplied,
    Session,
    Settings,
    StoreConfiguration,
    SubscriberLost,
    SubscriberRestarted,
    Tick,
    UnknownMeter,
    UsageError,
)
from outpost_core import _keys as keys
from outpost_core._effects import CloseConnection, Effect, ListPending, OpenConnection
from outpost_core._inputs import (
    BytesReceived,
    ConnectionFailed,
    ConnectionOpened,
    ListFailed,
    PendingListed,
    ScriptFailed,
)
from outpost_core._link import Link, LinkSettings, LinkState, Target
from outpost_core._observations import LinkChanged, SnapshotApplied
from outpost_core._remote import REQUEST_TIMEOUT, RETRY_BASE, RETRY_CAP, STEP_TIMEOUT, Remote
from outpost_core._session import _PortForRemote
from outpost_core._snapshots import CustomerFlow, Step
from tests.core._payloads import COUNT, STANDARD, TOKENS, UNIQUE, configuration, reducer
from tests.core._polar import FixedRandom, Peer, snapshot_message
from tests.core._reports import said

TARGET = Target(host="polar.test", port=443, tls=True)
C1 = Customer("external", "c1")
COLD = 1_796_223_600_000_000
HOT = COLD + 300_000_000
WALL = COLD + 400_000_000


def state(reducer_id: str, customer: Customer = C1) -> str:
    return keys.state_key(customer, reducer_id)


def events(reducer_id: str, customer: Customer = C1, bucket: int = COLD) -> str:
    """The events hash of one of the identity's buckets (COLD: before the snapshot's HOT)."""
    return keys.bucket_key(state(reducer_id, customer), bucket)


class Polar:
    """A session with a link, the Polar peer at the other end, and the effects in between."""

    def __init__(
        self,
        settings: Settings | None = None,
        link_settings: LinkSettings | None = None,
        payload: Any = STANDARD,
        *,
        subscribed: bool = True,
    ) -> None:
        self.link = Link(TARGET, "tok", FixedRandom(), link_settings)
        self.session = Session(settings, link=self.link)
        self.peer = Peer()
        self.now = 1.0
        self.pending: list[Effect] = []
        if payload is not None:
            self.session.handle(ConfigurationReceived(payload, from_cache=True))
        if subscribed:  # as a driver's subscriber confirms at start
            self.session.handle(SubscriberRestarted())

    # -- moving bytes -------------------------------------------------------------------------

    def effects(self) -> list[Effect]:
        """The session's effects; the bytes for Polar go to the peer, the rest is returned."""
        return self.peer.receive(self.session.effects())

    def connect(self) -> Self:
        """The session opens its WebSocket to Polar, which accepts; returns this ``Polar``."""
        self.session.handle(Tick(self.now, WALL))
        assert self.effects() == [OpenConnection(host="polar.test", port=443, tls=True)]
        self.session.handle(ConnectionOpened(self.now))
        assert self.effects() == []
        assert len(self.peer.requests) == 1
        self.session.handle(BytesReceived(self.now, self.peer.accept()))
        assert self.session.connected
        assert self.effects() == []
        assert self.peer.take()[0] == {"type": "configuration"}
        assert self.session.observations() == [LinkChanged("open", None, 1)]
        return self

    def send(self, message: Any) -> list[Effect]:
        self.session.handle(BytesReceived(self.now, self.peer.send(message)))
        return self.effects()

    def take(self) -> list[Any]:
        """What the session sent Polar, once its effects ran (and asked for nothing else)."""
        assert self.effects() == []
        return self.peer.take()

    def tick(self, now: float) -> list[Effect]:
        self.now = now
        self.session.handle(Tick(now, WALL))
        return self.effects()

    # -- a customer's snapshot ----------------------------------------------------------------

    def follow(self, meter: str = COUNT, fields: dict[str, str] | None = None) -> str:
        """First read: a load and a snapshot request; the load answers. Returns the request id."""
        assert self.session.read(meter, "c1") is None
        assert self.session.configuration is not None
        reducer_id = self.session.configuration.meter_reducers[meter]
        load_id = self.load_asked(state(reducer_id))
        [request] = self.peer.take()
        assert request["type"] == "snapshot"
        assert request["payload"]["external_customer_id"] == "c1"
        self.session.handle(IdentityLoaded(state(reducer_id), fields or {"rev": "0"}, load_id))
        assert self.effects() == []
        return str(request["payload"]["request_id"])

    def load_asked(self, key: str) -> int:
        """The session's effects are one load of ``key``: its number, for the answer."""
        [effect] = self.effects()
        assert isinstance(effect, LoadIdentity) and effect.key == key
        return effect.load_id

    def snapshot(self, request_id: str | None = None, **overrides: Any) -> list[Effect]:
        fields: dict[str, Any] = {
            "as_of": WALL - 1,
            "cold_until": HOT,
            "reducers": {
                "r-count": {"count": 3, "sum": 3, "min": 1, "max": 1},
                "r-tokens": {"count": 0, "sum": 0, "min": None, "max": None},
            },
            "credited": {COUNT: 10, TOKENS: 0},
        }
        return self.send(snapshot_message(request_id, "c1", **(fields | overrides)))


def remote(polar: Polar) -> Remote:
    assert polar.session.remote is not None
    return polar.session.remote


def step(flow: CustomerFlow) -> Step:
    """The flow's step, read through a call so that mypy does not narrow it between steps."""
    return flow.step


def listing(effects: list[Effect]) -> ListPending:
    [effect] = effects
    assert isinstance(effect, ListPending)
    return effect


def cold_listing(polar: Polar, listed: ListPending, *reducer_ids: str) -> ListPending:
    """Answer the listing of the state hashes: each of ``reducer_ids`` has a COLD bucket (and a
    HOT one, which is not listed); return the listing of the cold buckets' events that follows."""
    fields = {state(r): ["rev", f"a:{COLD}".encode(), f"a:{HOT}"] for r in reducer_ids}
    polar.session.handle(PendingListed(listed.tag, fields))
    following = listing(polar.effects())
    assert following.keys == tuple(sorted(events(r) for r in reducer_ids))
    return following


def list_events(polar: Polar, listed: ListPending, fields: dict[str, list[Any]]) -> None:
    """Answer both listings: the buckets (one COLD bucket per events hash of ``fields``), then
    the events, ``fields``."""
    reducers = [r for r in ("r-count", "r-tokens") if events(r) in fields]
    following = cold_listing(polar, listed, *reducers)
    polar.session.handle(PendingListed(following.tag, fields))


def applying(effects: list[Effect]) -> RunScript:
    [effect] = effects
    assert isinstance(effect, RunScript) and effect.script == "apply_snapshot"
    assert effect.tag is not None
    return effect


def apply_reply(rev: int = 1, **fields: str) -> str:
    flat = [x for pair in fields.items() for x in pair]
    return json.dumps({"c": [{"k": state("r-count"), "r": rev, "s": flat, "d": {}}]})


SNAPSHOT_FIELDS = {"cu": str(HOT), "sa": str(WALL - 1), "sid": "snap-1", "p": "3 3 1 1"}


def snapshot_applied(polar: Polar) -> None:
    """Polar sends c1's snapshot; Redis lists no pending event and applies it."""
    listed = listing(polar.snapshot(None))
    polar.session.handle(PendingListed(listed.tag, {}))
    run = applying(polar.effects())
    polar.session.handle(ScriptReplied(apply_reply(1, **SNAPSHOT_FIELDS), tag=run.tag))


# -- plumbing -------------------------------------------------------------------------------------


def test_a_session_with_a_link() -> None:
    polar = Polar()
    session = polar.session
    assert session.remote is not None and session.remote.link is polar.link
    assert not session.connected
    assert session.next_deadline() == 0.0  # the link wants a connection at once
    polar.connect()
    assert session.connected
    assert session.next_deadline() == polar.now + LinkSettings().ping_interval


def test_the_earliest_deadline_wins() -> None:
    polar = Polar(Settings(reload_retry=1.0)).connect()
    polar.session.handle(Tick(polar.now, WALL))
    polar.session.read(COUNT, "c1")
    polar.session.handle(LoadFailed(state("r-count"), polar.load_asked(state("r-count"))))
    # The retry (1.0 s with the link's draw of 0.5) comes before the ping.
    assert polar.session.next_deadline() == polar.now + 0.75


def test_close_connection_effects_and_connection_failures() -> None:
    polar = Polar().connect()
    polar.session.handle(ConnectionFailed(polar.now, "reset by peer"))
    assert polar.session.effects() == []
    assert not polar.session.connected
    assert polar.link.last_error == "reset by peer"


def test_a_connection_that_never_opened_fails_quietly() -> None:
    polar = Polar()
    polar.session.handle(Tick(polar.now, 0))
    assert [type(e) for e in polar.session.effects()] == [OpenConnection]
    polar.session.handle(ConnectionFailed(polar.now, "connection refused"))
    assert polar.session.observations() == []  # it was never open: nothing closed
    assert polar.link.last_error == "connection refused"


def test_polar_configures_the_session_and_the_cache_is_updated() -> None:
    polar = Polar(payload=None).connect()
    effects = polar.send({"type": "configuration", "payload": STANDARD})
    assert effects == [
        StoreConfiguration(
            key=keys.CONFIGURATION_KEY,
            text=json.dumps(STANDARD, separators=(",", ":"), ensure_ascii=False),
        )
    ]
    assert polar.session.configuration is not None


def test_host_methods() -> None:
    polar = Polar()
    session = polar.session
    assert session.known_rev(state("r-count")) == -1
    polar.connect()
    polar.follow(fields={"rev": "7"})
    assert session.known_rev(state("r-count")) == 7
    session.reject("frame", "x")
    assert session.rejections == {"frame": 1}
    hooks = _PortForRemote(session)  # what Polar's side may ask of its session
    assert hooks.pending_limit_us == Settings().pending_limit_us
    hooks.observe(LinkChanged("closed", "x", 1))
    assert session.observations() == [LinkChanged("closed", "x", 1)]
    assert session.observations() == []


def test_consumed_per_meter() -> None:
    polar = Polar(payload=configuration(reducer("r-count", [COUNT, "m-other"]), *[
        r for r in STANDARD["reducers"] if r["id"] != "r-count"
    ]))  # fmt: skip
    session = polar.session
    hooks = _PortForRemote(session)
    assert hooks.consumed(C1, "r-count") == {}  # not followed
    polar.connect()
    assert session.read(COUNT, "c1") is None
    assert hooks.consumed(C1, "r-count") == {}  # not loaded
    fields = {"rev": "1", "p": "2 2 1 1", "a:0": "1 1 1 1"}
    session.handle(IdentityLoaded(state("r-count"), fields, polar.load_asked(state("r-count"))))
    assert hooks.consumed(C1, "r-count") == {COUNT: 3.0, "m-other": 3.0}
    assert hooks.consumed(C1, "r-nope") == {}
    # A followed identity whose reducer became unbucketed, or left the configuration.
    changed = dict(STANDARD, reducers=[reducer("r-count", [COUNT], func="unique", prop="u")])
    session.handle(ConfigurationReceived(changed))
    assert hooks.consumed(C1, "r-count") == {}
    session.handle(ConfigurationReceived(configuration(reducer("x", ["m"]))))
    assert hooks.consumed(C1, "r-count") == {}
    assert _PortForRemote(Session()).consumed(C1, "r-count") == {}  # no configuration at all


def test_link_inputs_need_a_link_only_when_they_are_link_inputs() -> None:
    with pytest.raises(UsageError, match="ConnectionOpened but this session has no link"):
        Session().handle(ConnectionOpened(0.0))


# -- the snapshot flow ----------------------------------------------------------------------------


def test_first_read_waits_for_a_snapshot_this_instance_applied() -> None:
    polar = Polar().connect()
    # Redis already holds a snapshot (another instance applied it): not enough on its own.
    request_id = polar.follow(fields={"rev": "4", **SNAPSHOT_FIELDS})
    assert polar.session.read(COUNT, "c1") is None
    assert polar.session.not_ready_reason(COUNT, "c1", None) == (
        "no snapshot from Polar for external:c1 yet (WebSocket open)"
    )
    buckets = listing(polar.snapshot(request_id))
    assert buckets.keys == (state("r-count"), state("r-tokens"))  # which buckets hold events
    flow = remote(polar).flows[C1]
    assert (flow.request_id, step(flow)) == (None, Step.BUCKETS)
    polar.session.handle(
        PendingListed(
            buckets.tag,
            {
                state("r-count"): [b"rev", f"a:{HOT}", f"a:{COLD}".encode(), b"a:x", b"\xff", "n"],
                state("r-tokens"): [f"a:{COLD}", "a:\u00b2"],
            },
        )
    )
    listed = listing(polar.effects())  # the cold buckets' events only
    assert listed.keys == (events("r-count"), events("r-tokens"))
    assert (flow.request_id, step(flow)) == (None, Step.LISTING)
    polar.session.handle(
        PendingListed(
            listed.tag,
            {
                events("r-count"): [
                    f"{COLD}:e1".encode(),
                    f"{COLD}:e2",
                    f"{HOT}:e3".encode(),  # hot: the snapshot cannot count it
                    b"junk",
                    f"{COLD}:".encode(),
                    b"-5:e9",
                ],
                events("r-tokens"): [f"{COLD}:e1".encode()],
            },
        )
    )
    assert polar.effects() == []
    [question] = polar.take()
    assert question["type"] == "counted"
    assert question["payload"]["snapshot_id"] == "snap-1"
    assert question["payload"]["event_ids"] == ["e1", "e2"]
    assert step(flow) is Step.ASKING
    answer = {"request_id": question["payload"]["request_id"], "snapshot_id": "snap-1"}
    run = applying(
        polar.send({"type": "counted", "payload": dict(answer, event_ids=["e1", "zz", 5])})
    )
    acked = keys.acked_key
    assert run.keys == (
        state("r-count"),
        acked(state("r-count")),
        state("r-tokens"),
        acked(state("r-tokens")),
    )
    assert run.args == (
        keys.channel(keys.shard_of(C1)),
        str(WALL),
        str(Settings().pending_limit_us),
        str(HOT),
        str(WALL - 1),
        "snap-1",
        "2",
        COUNT,
        "10",
        TOKENS,
        "0",
        "4",  # the copy of r-count is loaded at revision 4
        "3 3 1 1",
        "1",
        f"{COLD}:e1",
        "-1",  # r-tokens is not followed
        "0 0 - -",
        "1",
        f"{COLD}:e1",
    )
    polar.session.handle(ScriptReplied(apply_reply(5, **SNAPSHOT_FIELDS), tag=run.tag))
    assert flow.applied and step(flow) is Step.IDLE
    balance = polar.session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and (balance.consumed, balance.revision) == (3.0, 5)
    [observation] = polar.session.observations()
    assert observation == SnapshotApplied(
        customer="external:c1",
        snapshot_id="snap-1",
        cold_until=HOT,
        counted=1,
        meter_ids=(COUNT,),
        local_consumed=(3.0,),
        polar_consumed=(3.0,),
    )
    assert remote(polar).snapshots_applied == 1
    assert remote(polar).snapshots_received == 1


def test_a_snapshot_without_pending_events_applies_at_once() -> None:
    polar = Polar().connect()
    polar.follow()
    listed = listing(polar.snapshot(None))
    polar.session.handle(PendingListed(listed.tag, {state("r-count"): [], state("r-tokens"): []}))
    run = applying(polar.effects())
    assert run.args[11:] == ("0", "3 3 1 1", "0", "-1", "0 0 - -", "0")
    assert polar.take() == []
    polar.session.handle(ScriptReplied(apply_reply(1, **SNAPSHOT_FIELDS), tag=run.tag))
    [observation] = polar.session.observations()
    assert isinstance(observation, SnapshotApplied)
    assert observation.meter_ids == (COUNT,)
    assert observation.local_consumed == (0.0,)  # an empty copy read nothing before it
    assert observation.polar_consumed == (3.0,)


def test_hot_buckets_are_never_listed() -> None:
    """However many events the hot buckets hold, the snapshot lists none of them: only the
    state hashes, and (here) no cold bucket, so it applies at once."""
    polar = Polar().connect()
    polar.follow()
    listed = listing(polar.snapshot(None))
    hot = {state("r-count"): [f"a:{HOT}", f"a:{HOT + 300_000_000}"], state("r-tokens"): ["rev"]}
    polar.session.handle(PendingListed(listed.tag, hot))
    run = applying(polar.effects())
    assert run.args[11:] == ("0", "3 3 1 1", "0", "-1", "0 0 - -", "0")


def test_cold_buckets_without_events_apply_at_once() -> None:
    """A cold bucket whose hash is empty (its events expired with it) asks Polar nothing."""
    polar = Polar().connect()
    polar.follow()
    listed = cold_listing(polar, listing(polar.snapshot(None)), "r-count", "r-tokens")
    polar.session.handle(PendingListed(listed.tag, {events("r-count"): [], events("r-tokens"): []}))
    run = applying(polar.effects())
    assert run.args[11:] == ("0", "3 3 1 1", "0", "-1", "0 0 - -", "0")
    assert polar.take() == []


def test_a_copy_loaded_during_the_apply_has_no_consumption_before_it() -> None:
    polar = Polar().connect()
    assert polar.session.read(COUNT, "c1") is None
    load_id = polar.load_asked(state("r-count"))  # not answered yet
    listed = listing(polar.snapshot(None))
    polar.session.handle(PendingListed(listed.tag, {}))
    run = applying(polar.effects())
    assert run.args[11] == "-1"
    fields = {"rev": "1", **SNAPSHOT_FIELDS}
    polar.session.handle(IdentityLoaded(state("r-count"), fields, load_id))
    polar.session.handle(
        ScriptReplied(json.dumps({"c": [{"k": state("r-count"), "r": 1}]}), tag=run.tag)
    )
    [observation] = polar.session.observations()
    assert isinstance(observation, SnapshotApplied)
    assert math.isnan(observation.local_consumed[0])
    assert observation.polar_consumed == (3.0,)
    balance = polar.session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and balance.consumed == 3.0


def test_many_pending_events_are_asked_in_chunks() -> None:
    polar = Polar().connect()
    polar.follow()
    listed = listing(polar.snapshot(None))
    names = [f"{COLD}:e{i:05d}" for i in range(10_001)]
    list_events(polar, listed, {events("r-count"): names})
    questions = polar.take()
    assert [len(q["payload"]["event_ids"]) for q in questions] == [10_000, 1]
    first, second = (q["payload"]["request_id"] for q in questions)
    assert polar.send({"type": "counted", "payload": {"request_id": second, "event_ids": []}}) == []
    run = applying(
        polar.send({"type": "counted", "payload": {"request_id": first, "event_ids": ["e00007"]}})
    )
    assert run.args[11:] == ("0", "3 3 1 1", "1", f"{COLD}:e00007", "-1", "0 0 - -", "0")


def test_a_snapshot_arriving_during_another_waits_and_the_newest_follows() -> None:
    polar = Polar().connect()
    polar.follow()
    first = listing(polar.snapshot(None))
    assert polar.snapshot(None, snapshot_id="snap-2", as_of=WALL) == []
    assert polar.snapshot(None, snapshot_id="snap-0", as_of=WALL - 5) == []
    polar.session.handle(PendingListed(first.tag, {}))
    run = applying(polar.effects())
    assert run.args[5] == "snap-1"
    polar.session.handle(ScriptReplied(apply_reply(1, **SNAPSHOT_FIELDS), tag=run.tag))
    second = listing(polar.effects())
    polar.session.handle(PendingListed(second.tag, {}))
    assert applying(polar.effects()).args[5] == "snap-2"


def test_an_unasked_for_snapshot_is_applied_but_never_asked_again() -> None:
    polar = Polar().connect()
    listed = listing(polar.snapshot(None, external_customer_id="c2"))
    polar.session.handle(PendingListed(listed.tag, {}))
    run = applying(polar.effects())
    assert run.keys[0] == state("r-count", Customer("external", "c2"))
    flow = remote(polar).flows[Customer("external", "c2")]
    assert flow.applied
    polar.session.handle(ScriptReplied(apply_reply(1, **SNAPSHOT_FIELDS), tag=run.tag))
    polar.effects()
    # Done: nothing of it is kept (nobody follows c2), and Polar is asked for nothing.
    assert Customer("external", "c2") not in remote(polar).flows
    assert polar.tick(polar.now + 2 * REQUEST_TIMEOUT) == []
    assert polar.take() == []


C2 = Customer("external", "c2")


def pushed_listing(polar: Polar) -> ListPending:
    """An unasked-for snapshot of c2 (as one still on its way after a ``forget``)."""
    aliases = {"customer_id": "9b2f4c1e-5d6a-4b7c-8e9f-0a1b2c3d4e5f"}
    listed = listing(polar.snapshot(None, external_customer_id="c2", aliases=aliases))
    assert remote(polar).flows[C2].pushed
    return listed


def test_an_unasked_for_snapshot_that_fails_is_given_up_without_asking_polar() -> None:
    polar = Polar().connect()
    listed = pushed_listing(polar)
    polar.session.handle(ListFailed(listed.tag))
    assert polar.effects() == []
    assert C2 not in remote(polar).flows and C2 not in remote(polar).aliases
    assert polar.tick(polar.now + RETRY_CAP + REQUEST_TIMEOUT) == []
    assert polar.take() == []


def test_an_unasked_for_snapshot_stuck_in_a_step_is_given_up_without_asking_polar() -> None:
    polar = Polar().connect()
    pushed_listing(polar)
    assert polar.tick(polar.now + STEP_TIMEOUT + 1) == []
    assert C2 not in remote(polar).flows
    assert polar.take() == []


def test_an_unasked_for_snapshot_in_progress_when_the_link_drops_is_given_up() -> None:
    polar = Polar().connect()
    polar.follow()
    pushed_listing(polar)
    polar.session.handle(BytesReceived(polar.now, b""))  # Polar hung up
    assert polar.effects() == [CloseConnection()]
    assert set(remote(polar).flows) == {C1}  # the followed customer's flow stays


def test_a_customer_read_while_its_unasked_for_snapshot_applies_is_asked_for() -> None:
    polar = Polar().connect()
    pushed_listing(polar)
    flow = remote(polar).follow(C2)  # as a first read of c2 does
    assert not flow.pushed
    [request] = polar.take()
    assert request["type"] == "snapshot"
    assert request["payload"]["external_customer_id"] == "c2"


def test_an_unanswered_request_is_sent_again() -> None:
    polar = Polar().connect()
    first = polar.follow()
    assert polar.tick(polar.now + REQUEST_TIMEOUT - 0.01) == []
    assert polar.take() == []
    assert polar.tick(polar.now + 0.01) == []  # at the deadline itself
    [again] = polar.take()
    assert again["payload"]["request_id"] != first


def test_a_stale_answer_to_a_request_does_not_clear_the_newer_one() -> None:
    polar = Polar().connect()
    polar.follow()
    polar.tick(polar.now + REQUEST_TIMEOUT + 1)
    [again] = polar.take()
    listing(polar.snapshot("s-stale"))
    flow = remote(polar).flows[C1]
    assert flow.request_id == again["payload"]["request_id"]


def test_reconnecting_asks_again_for_every_followed_customer() -> None:
    polar = Polar().connect()
    polar.follow()
    listing(polar.snapshot(None))
    polar.session.handle(BytesReceived(polar.now, b""))  # Polar hung up mid-flow
    assert polar.effects() == [CloseConnection()]
    flow = remote(polar).flows[C1]
    assert (step(flow), flow.current) == (Step.IDLE, None)
    [closed] = polar.session.observations()
    assert closed == LinkChanged("closed", "Polar closed the connection", 1)
    assert "WebSocket disconnected: Polar closed the connection" in (
        polar.session.not_ready_reason(COUNT, "c1", None)
    )
    # Reconnect once the backoff passed.
    polar.peer = Peer()
    polar.now = polar.link.retry_at
    polar.session.handle(Tick(polar.now, WALL))
    assert polar.effects() == [OpenConnection(host="polar.test", port=443, tls=True)]
    polar.session.handle(ConnectionOpened(polar.now))
    polar.effects()
    polar.session.handle(BytesReceived(polar.now, polar.peer.accept()))
    assert polar.effects() == []
    assert [m["type"] for m in polar.take()] == ["configuration", "snapshot"]
    assert polar.session.observations() == [LinkChanged("open", None, 2)]


def test_a_dead_connection_found_by_tick_is_closed() -> None:
    polar = Polar(link_settings=LinkSettings(dead_after=40.0, ping_interval=100.0)).connect()
    assert polar.tick(polar.now + 41.0) == [CloseConnection()]
    assert polar.session.observations() == [
        LinkChanged("closed", "no frame from Polar for 40 s", 1)
    ]


def test_a_handshake_that_times_out_closes_the_connection() -> None:
    polar = Polar(link_settings=LinkSettings(connect_timeout=5.0))
    polar.session.handle(Tick(polar.now, WALL))
    polar.effects()
    polar.session.handle(ConnectionOpened(polar.now))
    polar.effects()
    assert polar.tick(polar.now + 6.0) == [CloseConnection()]


def test_a_broken_open_connection_is_observed() -> None:
    polar = Polar().connect()
    polar.session.handle(ConnectionFailed(polar.now, "reset"))
    assert polar.session.observations() == [LinkChanged("closed", "reset", 1)]


def test_a_drop_during_a_flow_step_closes_the_connection_even_before_open() -> None:
    polar = Polar().connect()
    polar.follow()
    listed = listing(polar.snapshot(None))
    polar.session.handle(ConnectionFailed(polar.now, "reset"))
    assert polar.effects() == []
    polar.session.handle(PendingListed(listed.tag, {}))  # too late: abandoned
    assert polar.effects() == []


# -- what goes wrong ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        ("not json", "frame"),
        ("[1]", "frame"),
        ('{"payload": {}}', "frame"),
        ('{"type": 3}', "frame"),
        ('{"type": "news"}', "frame"),
        ('{"type": "snapshot", "payload": {}}', "snapshot"),
        ('{"type": "counted", "payload": []}', "counted"),
        ('{"type": "counted", "payload": {"request_id": "q404"}}', "counted"),
        ('{"type": "error"}', "error"),
        ('{"type": "error", "payload": {"code": "invalid_frame", "message": "?"}}', "error"),
        ('{"type": "configuration", "payload": null}', "configuration"),
    ],
)
def test_bad_frames_are_counted_and_survived(frame: str, kind: str) -> None:
    polar = Polar().connect()
    polar.session.handle(BytesReceived(polar.now, polar.peer.send_text(frame)))
    assert polar.effects() == []
    assert polar.session.rejections == {kind: 1}
    assert polar.session.connected


@pytest.mark.parametrize(
    "field", [b"\xff\xfe:e1", "\u00b2:e1", "\u00b2:e1".encode(), b"junk", b"-5:e9", f"{COLD}:"]
)
def test_unreadable_pending_fields_are_counted_and_skipped(field: bytes | str) -> None:
    polar = Polar().connect()
    listed = listing(polar.snapshot(polar.follow()))
    fields: dict[str, list[Any]] = {events("r-count"): [field, f"{COLD}:e1"]}
    list_events(polar, listed, fields)
    assert polar.session.rejections == {"state": 1}
    [question] = polar.take()
    assert question["payload"]["event_ids"] == ["e1"]


def test_a_snapshot_with_an_integer_beyond_floats_is_counted_and_survived() -> None:
    polar = Polar().connect()
    polar.follow()
    huge = {"count": 1, "sum": 10**400, "min": 1, "max": 1}
    assert polar.snapshot(None, reducers={"r-count": huge}) == []
    assert polar.session.rejections == {"snapshot": 1}
    assert polar.session.connected


def asking(polar: Polar) -> str:
    """Follow c1, take a snapshot to the counted question; return the question's id."""
    polar.connect()
    polar.follow()
    listed = listing(polar.snapshot(None))
    list_events(polar, listed, {events("r-count"): [f"{COLD}:e1"]})
    [question] = polar.take()
    return str(question["payload"]["request_id"])


def test_an_expired_snapshot_is_asked_for_again() -> None:
    polar = Polar()
    question = asking(polar)
    error = {"request_id": question, "code": "snapshot_expired", "message": "too old"}
    assert polar.send({"type": "error", "payload": error}) == []
    assert polar.session.rejections == {}
    [request] = polar.take()
    assert request["type"] == "snapshot"
    # The answer to the abandoned question is now an answer to no question.
    polar.send({"type": "counted", "payload": {"request_id": question, "event_ids": []}})
    assert polar.session.rejections == {"counted": 1}


def test_another_error_about_a_question_is_counted_and_asked_again() -> None:
    polar = Polar()
    question = asking(polar)
    error = {"request_id": question, "code": "too_many_ids", "message": "no"}
    assert polar.send({"type": "error", "payload": error}) == []
    assert polar.session.rejections == {"error": 1}
    assert [m["type"] for m in polar.take()] == ["snapshot"]


def test_an_answer_without_a_list_of_ids_restarts_the_flow() -> None:
    polar = Polar()
    question = asking(polar)
    polar.send({"type": "counted", "payload": {"request_id": question, "event_ids": "e1"}})
    assert polar.session.rejections == {"counted": 1}
    assert [m["type"] for m in polar.take()] == ["snapshot"]


def test_a_failed_listing_asks_again_after_a_backoff() -> None:
    polar = Polar().connect()
    polar.follow()
    listed = listing(polar.snapshot(None))
    flow = remote(polar).flows[C1]
    polar.session.handle(ListFailed(listed.tag))
    assert polar.effects() == [] and polar.take() == []  # not at once: Redis may be down
    assert (step(flow), flow.current, flow.failures) == (Step.IDLE, None, 1)
    assert flow.retry_at == polar.now + RETRY_BASE * 0.75  # the link's draw: 0.5
    assert polar.session.next_deadline() == flow.retry_at
    polar.session.handle(ListFailed(listed.tag))  # once is enough
    polar.session.handle(PendingListed(listed.tag, {}))  # and a late answer is ignored
    assert polar.effects() == [] and polar.take() == []
    assert polar.tick(flow.retry_at - 0.001) == [] and polar.take() == []
    assert polar.tick(flow.retry_at) == []
    assert [m["type"] for m in polar.take()] == ["snapshot"]
    assert flow.retry_at is None


def test_a_failed_apply_asks_again_after_a_backoff() -> None:
    polar = Polar().connect()
    polar.follow()
    listed = listing(polar.snapshot(None))
    polar.session.handle(PendingListed(listed.tag, {}))
    run = applying(polar.effects())
    assert run.tag is not None
    polar.session.handle(ScriptFailed(run.tag))
    flow = remote(polar).flows[C1]
    assert polar.take() == []
    assert flow.retry_at == polar.now + RETRY_BASE * 0.75
    assert not flow.applied
    polar.session.handle(ScriptFailed(run.tag))
    polar.session.handle(ScriptReplied(apply_reply(), tag=run.tag))  # too late
    assert not flow.applied
    polar.tick(flow.retry_at)
    assert [m["type"] for m in polar.take()] == ["snapshot"]


def fail_once_more(polar: Polar, flow: CustomerFlow, *, apply: bool) -> float:
    """Polar's snapshot comes; Redis fails to list (or to apply) it. Returns the delay set."""
    listed = listing(polar.snapshot(None))
    if apply:
        polar.session.handle(PendingListed(listed.tag, {}))
        run = applying(polar.effects())
        assert run.tag is not None
        polar.session.handle(ScriptFailed(run.tag))
    else:
        polar.session.handle(ListFailed(listed.tag))
    assert flow.retry_at is not None
    return flow.retry_at - polar.now


@pytest.mark.parametrize("apply", [False, True])
def test_failures_in_a_row_back_off_further_up_to_the_cap(apply: bool) -> None:
    polar = Polar().connect()
    polar.follow()
    flow = remote(polar).flows[C1]
    delays = []
    for _ in range(8):
        delays.append(fail_once_more(polar, flow, apply=apply))
        assert polar.tick(polar.now + delays[-1] / 2) == [] and polar.take() == []
        assert flow.retry_at is not None
        polar.tick(flow.retry_at)
        assert [m["type"] for m in polar.take()] == ["snapshot"]
    ceilings = [min(RETRY_CAP, RETRY_BASE * 2**n) for n in range(8)]
    assert delays == pytest.approx([c * 0.75 for c in ceilings])
    assert delays[-1] == pytest.approx(RETRY_CAP * 0.75)
    # A snapshot applied ends the run of failures: the next failure waits the first delay.
    snapshot_applied(polar)
    assert (flow.applied, flow.failures) == (True, 0)
    assert fail_once_more(polar, flow, apply=apply) == pytest.approx(RETRY_BASE * 0.75)


def test_a_snapshot_arriving_during_the_backoff_starts_at_once() -> None:
    polar = Polar().connect()
    polar.follow()
    flow = remote(polar).flows[C1]
    fail_once_more(polar, flow, apply=False)
    listing(polar.snapshot(None, snapshot_id="snap-2"))  # Polar pushed one meanwhile
    assert (step(flow), flow.retry_at) == (Step.BUCKETS, None)


@pytest.mark.parametrize("stuck", [Step.BUCKETS, Step.LISTING, Step.ASKING, Step.APPLYING])
def test_a_flow_stuck_in_a_step_asks_polar_again_and_ignores_the_late_answer(
    stuck: Step,
) -> None:
    polar = Polar().connect()
    polar.follow()
    polar.now = 50.0
    listed = listing(polar.snapshot(None))
    flow = remote(polar).flows[C1]
    if stuck is Step.LISTING:
        listed = cold_listing(polar, listed, "r-count")
    elif stuck is Step.ASKING:
        list_events(polar, listed, {events("r-count"): [f"{COLD}:e1"]})
        [question] = polar.take()
        answer = {"request_id": question["payload"]["request_id"], "event_ids": ["e1"]}
    elif stuck is Step.APPLYING:
        polar.session.handle(PendingListed(listed.tag, {}))
        run = applying(polar.effects())
    assert step(flow) is stuck
    assert polar.session.next_deadline() == 50.0 + STEP_TIMEOUT
    assert polar.tick(50.0 + STEP_TIMEOUT - 0.01) == [] and polar.take() == []
    said(polar.session)
    assert polar.tick(50.0 + STEP_TIMEOUT) == []  # a driver waking at the deadline acts
    [again] = polar.take()
    assert again["type"] == "snapshot" and again["payload"]["request_id"] == flow.request_id
    assert (step(flow), flow.current, flow.tag, flow.retry_at) == (Step.IDLE, None, None, None)
    assert polar.session.rejections == {"stuck_flow": 1}
    rejected = f"outpost rejected stuck_flow: {C1}: no answer while {stuck.value}"
    assert (logging.WARNING, rejected) in said(polar.session)
    # The answer that was lost turns up: it belongs to a flow given up, and changes nothing.
    if stuck in (Step.BUCKETS, Step.LISTING):
        polar.session.handle(PendingListed(listed.tag, {}))
        assert polar.effects() == []
    elif stuck is Step.ASKING:
        assert polar.send({"type": "counted", "payload": answer}) == []
        assert polar.session.rejections == {"stuck_flow": 1, "counted": 1}
    else:
        polar.session.handle(ScriptReplied(apply_reply(1, **SNAPSHOT_FIELDS), tag=run.tag))
        assert polar.session.observations() == []
        assert polar.effects() == []
    assert (step(flow), flow.applied) == (Step.IDLE, False)
    assert polar.take() == []
    # The fresh request is what the flow now waits for.
    assert polar.session.next_deadline() == polar.now + REQUEST_TIMEOUT


def test_a_step_that_moves_on_in_time_is_not_stuck() -> None:
    polar = Polar().connect()
    polar.follow()
    polar.now = 50.0
    listed = listing(polar.snapshot(None))
    assert polar.tick(50.0 + STEP_TIMEOUT - 1) == []  # the listing answers late, but in time
    list_events(polar, listed, {events("r-count"): [f"{COLD}:e1"]})
    polar.take()
    # The next step has its own deadline, counted from when it began.
    assert polar.session.next_deadline() == polar.now + STEP_TIMEOUT
    assert polar.tick(50.0 + STEP_TIMEOUT + 1) == []
    assert polar.session.rejections == {}
    assert step(remote(polar).flows[C1]) is Step.ASKING


def test_the_earliest_flow_deadline_wins() -> None:
    polar = Polar().connect()
    assert polar.tick(5.0) == []
    polar.follow()
    other = Customer("external", "c2")
    # An unanswered request: asked again after REQUEST_TIMEOUT.
    assert polar.session.next_deadline() == 5.0 + REQUEST_TIMEOUT
    # An applied flow has no deadline of its own; nor does the link before its ping.
    assert polar.tick(6.0) == []
    listed = listing(polar.snapshot(None, external_customer_id="c2"))
    assert remote(polar).flows[other].applied
    assert polar.session.next_deadline() == 5.0 + REQUEST_TIMEOUT
    polar.session.handle(PendingListed(listed.tag, {}))
    run = applying(polar.effects())
    polar.session.handle(ScriptReplied("{}", tag=run.tag))
    assert polar.session.next_deadline() == 5.0 + REQUEST_TIMEOUT
    # A flow waiting for a backoff.
    assert polar.tick(7.0) == []
    polar.session.handle(ListFailed(listing(polar.snapshot(None)).tag))
    assert polar.session.next_deadline() == 7.0 + RETRY_BASE * 0.75


def test_the_link_closing_for_good_mid_listing_restarts_quietly() -> None:
    polar = Polar().connect()
    polar.follow()
    listed = listing(polar.snapshot(None))
    listed = cold_listing(polar, listed, "r-count")
    polar.link.close()
    polar.session.handle(PendingListed(listed.tag, {events("r-count"): [f"{COLD}:e1"]}))
    flow = remote(polar).flows[C1]
    assert (step(flow), flow.request_id) == (Step.IDLE, None)


def test_an_unsupported_meter_is_refused_before_following() -> None:
    from outpost_core import UnsupportedMeter

    polar = Polar().connect()
    with pytest.raises(UnsupportedMeter):
        polar.session.read(UNIQUE, "c1")
    assert remote(polar).flows == {}


def test_a_disconnected_session_explains_why_it_is_not_ready() -> None:
    polar = Polar()
    polar.session.read(COUNT, "c1")
    load_id = polar.load_asked(state("r-count"))
    polar.session.handle(IdentityLoaded(state("r-count"), {"rev": "1"}, load_id))
    assert polar.session.not_ready_reason(COUNT, "c1", None) == (
        "no snapshot from Polar for external:c1 yet (WebSocket disconnected)"
    )
    assert polar.link.state is LinkState.DISCONNECTED


def refused_upgrade(polar: Polar, status: int, body: bytes | None) -> list[Effect]:
    """Connect when the link wants to; Polar refuses the upgrade. Returns the effects."""
    polar.now = max(polar.now, polar.link.retry_at)
    assert polar.tick(polar.now) == [OpenConnection(host="polar.test", port=443, tls=True)]
    polar.session.handle(ConnectionOpened(polar.now))
    polar.peer = Peer()
    polar.effects()
    polar.session.handle(BytesReceived(polar.now, polar.peer.reject(status, body)))
    return polar.effects()


def test_a_refused_token_is_logged_as_an_error_once_per_cause() -> None:
    polar = Polar()
    assert refused_upgrade(polar, 401, b'{"detail":"invalid token"}') == [CloseConnection()]
    refused_upgrade(polar, 401, b'{"detail":"invalid token"}')  # the same again: quiet
    refused_upgrade(polar, 403, b'{"detail":"token revoked"}')
    assert said(polar.session, logging.WARNING) == [
        (
            logging.ERROR,
            "outpost: Polar refused the WebSocket with HTTP 401: invalid token",
        ),
        (
            logging.ERROR,
            "outpost: Polar refused the WebSocket with HTTP 403: token revoked",
        ),
    ]
    assert polar.session.link_status() == (
        "disconnected",
        "Polar refused the WebSocket with HTTP 403: token revoked",
    )


def test_a_404_is_polar_serving_its_public_api_not_an_error() -> None:
    polar = Polar()
    refused_upgrade(polar, 404, b'{"detail":"Not Found"}')
    assert said(polar.session, logging.INFO) == [
        (logging.INFO, "outpost: Polar refused the WebSocket with HTTP 404: Not Found")
    ]


def test_bytes_that_are_not_a_refusal_log_nothing() -> None:
    polar = Polar().connect()
    polar.send({"type": "configuration", "payload": STANDARD})
    assert said(polar.session, logging.WARNING) == []
    assert polar.session.link_status() == ("open", None)


def test_the_link_status_says_why_it_last_failed() -> None:
    polar = Polar()
    assert polar.session.link_status() == ("disconnected", None)
    polar.connect()
    polar.session.handle(ConnectionFailed(polar.now, "reset by peer"))
    assert polar.session.link_status() == ("disconnected", "reset by peer")


def test_waiting_for_a_configuration_says_how_the_websocket_is() -> None:
    polar = Polar(payload=None)
    assert polar.session.read(COUNT, "c1") is None
    assert polar.session.not_ready_reason(COUNT, "c1", None) == (
        "no configuration from Polar yet (WebSocket disconnected)"
    )
    refused_upgrade(polar, 401, b'{"detail":"invalid token"}')
    assert polar.session.not_ready_reason(COUNT, "c1", None) == (
        "no configuration from Polar yet (WebSocket disconnected: "
        "Polar refused the WebSocket with HTTP 401: invalid token)"
    )


def test_a_fetched_hash_that_lost_its_snapshot_asks_polar_again() -> None:
    polar = Polar().connect()
    polar.follow()
    snapshot_applied(polar)
    polar.session.handle(SubscriberLost())
    assert polar.session.read(COUNT, "c1") == Fetch(keys=(state("r-count"),))
    # Redis answers the fetch with a hash that has no snapshot any more (expired, wiped).
    polar.tick(polar.now + REQUEST_TIMEOUT)
    assert polar.session.read_fetched(COUNT, "c1", None, {state("r-count"): {"rev": "9"}}) is None
    [request] = polar.take()
    assert request["type"] == "snapshot"
    assert not remote(polar).flows[C1].applied


def test_a_meter_missing_from_the_cached_configuration_waits_for_polars() -> None:
    polar = Polar()  # configured from the cache only
    with pytest.raises(UnknownMeter):
        polar.session.not_ready_reason("m-new", "c1", None)  # the deadline came: say so
    assert polar.session.read("m-new", "c1") is None  # the cache may predate the meter
    polar.connect()
    polar.send({"type": "configuration", "payload": STANDARD})  # Polar's: still no m-new
    with pytest.raises(UnknownMeter):
        polar.session.read("m-new", "c1")


def test_a_meter_missing_from_the_cache_while_polar_refuses_names_the_refusal() -> None:
    polar = Polar()  # configured from the cache only (an earlier token's)
    refused_upgrade(polar, 401, b'{"detail":"invalid token"}')
    assert polar.session.not_ready_reason("m-new", "c1", None) == (
        "meter 'm-new' is not in the configuration cached in Redis and Polar's has not arrived "
        "(WebSocket disconnected: Polar refused the WebSocket with HTTP 401: invalid token)"
    )


def test_closing_says_goodbye_and_never_reconnects() -> None:
    polar = Polar().connect()
    polar.session.handle(Closing())
    polar.effects()
    assert polar.peer.closes == [1000]
    assert not polar.session.connected
    polar.session.handle(Tick(polar.now + 3600, WALL))
    assert polar.effects() == []  # no OpenConnection: closed for good


def test_closing_a_session_without_a_link_does_nothing() -> None:
    session = Session()
    session.handle(Closing())
    assert session.effects() == []


def test_a_state_that_lost_its_snapshot_asks_polar_again() -> None:
    polar = Polar().connect()
    polar.follow()
    snapshot_applied(polar)
    assert polar.session.read(COUNT, "c1") is not None
    # The identity's keys expired (or Redis was wiped): a reload finds no snapshot any more.
    polar.session.handle(SubscriberRestarted())
    reload = polar.load_asked(state("r-count"))
    polar.session.handle(IdentityLoaded(state("r-count"), {"rev": "17962332846298"}, reload))
    assert polar.session.read(COUNT, "c1") is None
    # The last request went out under REQUEST_TIMEOUT ago: a Polar whose snapshots keep lacking
    # the reducer must not get a request per read. Later, one goes.
    assert polar.take() == []
    polar.session.handle(Tick(polar.now + REQUEST_TIMEOUT, WALL))
    assert polar.effects() == []
    assert polar.session.read(COUNT, "c1") is None
    [request] = polar.take()
    assert request["type"] == "snapshot"
    assert polar.session.read(COUNT, "c1") is None  # asked once, not on every read
    assert polar.take() == []


def test_polar_unreachable_is_one_warning_a_reminder_a_minute_and_one_line_when_back() -> None:
    polar = Polar().connect()
    said(polar.session)
    for now in (2.0, 3.0, 30.0, 63.0, 64.0):  # every try to reconnect fails
        polar.session.handle(ConnectionFailed(now, "cannot connect: connection refused"))
    polar.peer = Peer()
    polar.now = max(70.0, polar.link.retry_at)
    polar.session.handle(Tick(polar.now, WALL))
    assert [type(e) for e in polar.effects()] == [OpenConnection]
    polar.session.handle(ConnectionOpened(polar.now))
    polar.effects()
    polar.session.handle(BytesReceived(polar.now, polar.peer.accept()))
    assert polar.session.connected
    assert said(polar.session, logging.INFO) == [
        (
            logging.WARNING,
            "outpost: Polar unreachable for the WebSocket: cannot connect: connection refused",
        ),
        (
            logging.WARNING,
            "outpost: Polar still unreachable for the WebSocket after 61 s: "
            "cannot connect: connection refused",
        ),
        (logging.INFO, "outpost: Polar is back for the WebSocket after 68.0 s"),
    ]


def test_an_unreachable_polar_cannot_forge_a_log_line() -> None:
    polar = Polar().connect()
    reason = "the proxy refused the tunnel: 407 denied\nERROR outpost: forged \x1b[2J"
    said(polar.session)
    polar.session.handle(ConnectionFailed(2.0, reason))
    [(_, line)] = said(polar.session, logging.WARNING)
    assert "\n" not in line and "\x1b" not in line
    assert "407 denied" in line
