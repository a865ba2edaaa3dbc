"""The session without a link to Polar: track(), reads, copies, configuration (``_session``)."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import attrs
import pytest

from outpost_core import (
    Balance,
    ChangePublished,
    ChannelsLost,
    ChannelSubscribed,
    ConfigurationReceived,
    ConnectionFailed,
    Customer,
    Fetch,
    IdentityLoaded,
    InvalidEvent,
    LoadFailed,
    LoadIdentity,
    NotReady,
    Report,
    RunScript,
    ScriptReplied,
    Session,
    Settings,
    Status,
    StoreConfiguration,
    SubscriberLost,
    SubscriberRestarted,
    Tick,
    UnknownMeter,
    UnsupportedMeter,
    UsageError,
    from_us,
)
from outpost_core import _keys as keys
from outpost_core._aggregate import Aggregate
from outpost_core._inputs import ListFailed, PendingListed, ScriptFailed
from outpost_core._link import Link, Target
from outpost_core._time import HOUR_US
from tests.core._payloads import (
    AVERAGE,
    COUNT,
    LARGEST,
    SMALLEST,
    STANDARD,
    TOKENS,
    UNIQUE,
    configuration,
    reducer,
)
from tests.core._polar import FixedRandom

NOW = 1_796_223_600_000_000 + 42_000_000  # 42 s into a bucket
BUCKET = 1_796_223_600_000_000
C1 = Customer("external", "c1")
UUID = "9f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"


def state(reducer_id: str, customer: Customer = C1) -> str:
    return keys.state_key(customer, reducer_id)


def configured(
    payload: Any = STANDARD, settings: Settings | None = None, *, subscribed: bool = True
) -> Session:
    """A session with a configuration; ``subscribed``: Redis confirmed the subscription (as a
    driver's subscriber does at start), so the copies it loads follow Redis."""
    session = Session(settings)
    session.handle(ConfigurationReceived(payload))
    assert session.effects() == [
        StoreConfiguration(key=keys.CONFIGURATION_KEY, text=_compact(payload))
    ]
    if subscribed:
        session.handle(SubscriberRestarted())
        assert session.effects() == []
    return session


def load_asked(session: Session, key: str) -> int:
    """Drain the effects: one load of ``key``; return its number (for the answer)."""
    [effect] = session.effects()
    assert isinstance(effect, LoadIdentity) and effect.key == key
    return effect.load_id


def loads_asked(session: Session) -> dict[str, int]:
    """Drain the effects: only loads; return each key's load number."""
    effects = session.effects()
    assert all(isinstance(e, LoadIdentity) for e in effects)
    return {e.key: e.load_id for e in effects if isinstance(e, LoadIdentity)}


def _compact(payload: Any) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def snapshot_fields(
    rev: int = 3, extra: dict[str, str] | None = None, **named: str
) -> dict[str, str]:
    fields = {
        "rev": str(rev),
        "cu": str(BUCKET),
        "sa": str(NOW - 1),
        "sid": "s-1",
        "p": "2 5 1 4",
        "c:m-count": "10",
        "c:m-tokens": "100",
        "n": "0",
        "u": "0",
    }
    fields.update(extra or {})
    fields.update(named)
    return fields


def warm(
    session: Session,
    meter: str = COUNT,
    reducer_id: str = "r-count",
    fields: dict[str, str] | None = None,
    customer: Customer = C1,
    **who: Any,
) -> Balance:
    """First read: None and a load; the load answers; the second read has a balance."""
    who = who or {"external_customer_id": customer.id}
    assert session.read(meter, **who) is None
    key = state(reducer_id, customer)
    load_id = load_asked(session, key)
    session.handle(IdentityLoaded(key, fields or snapshot_fields(), load_id))
    assert session.effects() == []
    balance = session.read(meter, **who)
    assert isinstance(balance, Balance) and balance.source == "memory"
    return balance


def track(session: Session, **overrides: Any) -> RunScript:
    arguments: dict[str, Any] = {
        "name": "api_call",
        "external_customer_id": "c1",
        "metadata": {"tokens": 7},
        "timestamp_us": NOW,
        "now_us": NOW,
        "event_id": "e1",
    }
    arguments.update(overrides)
    return session.track(**arguments)


def reply(*changes: dict[str, Any]) -> str:
    return json.dumps({"c": list(changes)})


def delta(key: str, rev: int, *pairs: str, deleted: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"k": key, "r": rev, "s": list(pairs), "d": list(deleted)}


# -- settings and plumbing ------------------------------------------------------------------------


def test_default_settings() -> None:
    settings = Settings()
    assert (settings.snapshot_timeout, settings.pending_limit_us, settings.reload_retry) == (
        5.0,
        HOUR_US,
        0.5,
    )
    assert Session().settings == settings
    assert Session().settings.pending_limit_us == HOUR_US
    assert Session(Settings(pending_limit_us=7)).settings.pending_limit_us == 7


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"snapshot_timeout": -0.001}, "snapshot_timeout must be a finite number"),
        ({"pending_limit_us": 0}, "must be positive"),
        ({"pending_limit_us": -1}, "must be positive"),
        ({"reload_retry": 0}, "must be a positive"),
        ({"reload_retry": -1.0}, "must be a positive"),
    ],
)
def test_settings_refuse_bad_values(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Settings(**arguments)


def test_settings_accept_a_zero_timeout_and_are_keyword_only() -> None:
    assert Settings(snapshot_timeout=0).snapshot_timeout == 0
    with pytest.raises(TypeError):
        Settings(1.0)  # type: ignore[call-arg]


@pytest.mark.parametrize("name", ["snapshot_timeout", "reload_retry"])
def test_settings_refuse_nan(name: str) -> None:
    with pytest.raises(UsageError):
        arguments: dict[str, Any] = {name: math.nan}
        Settings(**arguments)


def test_a_fresh_session() -> None:
    session = Session()
    assert session.configuration is None
    assert session.effects() == []
    assert session.next_deadline() is None
    assert session.followed == []
    assert session.remote is None
    assert not session.connected
    assert session.rejections == {}
    assert session.observations() == []
    assert session.reports() == []


def test_a_session_can_drop_its_link() -> None:
    session = Session(link=Link(Target.of("http://polar.test"), "token", FixedRandom()))
    assert session.remote is not None
    session.drop_link()
    assert session.remote is None and session.link_status() == ("none", None)
    session.drop_link()  # twice: nothing more to do
    assert session.remote is None
    # What the link loop still had in flight is dropped, not an error.
    session.handle(ConnectionFailed(1.0, "closed"))
    assert session.effects() == []


def test_effects_are_drained() -> None:
    session = configured()
    assert session.effects() == []
    session.emit(LoadIdentity(key="k", load_id=1))
    assert session.effects() == [LoadIdentity(key="k", load_id=1)]
    assert session.effects() == []


def test_handle_refuses_what_is_not_an_input() -> None:
    with pytest.raises(UsageError, match="not an input"):
        Session().handle("ScriptReplied")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not an input"):
        Session().handle(LoadIdentity(key="k", load_id=1))  # type: ignore[arg-type]


def test_remote_inputs_without_a_link() -> None:
    from outpost_core._inputs import BytesReceived, ConnectionFailed, ConnectionOpened

    session = configured()
    for event in (BytesReceived(0.0, b"x"), ConnectionOpened(0.0), ConnectionFailed(0.0, "x")):
        with pytest.raises(UsageError, match="has no link"):
            session.handle(event)
    # Answers to the remote side's requests are ignored when there is no remote side.
    session.handle(PendingListed(tag=1, fields={}))
    session.handle(ListFailed(tag=1))
    session.handle(ScriptFailed(tag=1))
    session.handle(ScriptReplied(reply(), tag=1))
    assert session.effects() == []
    assert session.rejections == {}


# -- configuration --------------------------------------------------------------------------------


def test_configuration_from_polar_is_stored_in_the_cache() -> None:
    session = Session()
    session.handle(ConfigurationReceived(STANDARD))
    assert session.configuration is not None
    assert set(session.configuration.reducers) == {r["id"] for r in STANDARD["reducers"]}
    [store] = session.effects()
    assert store == StoreConfiguration(key="outpost:v2:configuration", text=_compact(STANDARD))
    assert json.loads(store.text) == STANDARD


def test_configuration_from_the_cache_is_not_stored_again() -> None:
    session = Session()
    session.handle(ConfigurationReceived(STANDARD, from_cache=True))
    assert session.configuration is not None
    assert session.effects() == []


def test_the_same_configuration_again_changes_nothing() -> None:
    session = configured()
    before = session.configuration
    session.handle(ConfigurationReceived(json.loads(json.dumps(STANDARD))))
    assert session.configuration is before
    assert session.effects() == []


def test_the_cache_never_overrides_polars_configuration() -> None:
    session = configured()
    before = session.configuration
    session.handle(ConfigurationReceived(configuration(reducer("other", ["m"])), from_cache=True))
    assert session.configuration is before
    assert session.effects() == []


def test_polar_overrides_the_cache_and_a_newer_polar_configuration() -> None:
    session = Session()
    session.handle(ConfigurationReceived(configuration(reducer("old", ["m"])), from_cache=True))
    session.handle(ConfigurationReceived(STANDARD))
    assert session.configuration is not None and "r-count" in session.configuration.reducers
    assert len(session.effects()) == 1
    newer = configuration(reducer("new", ["m"]))
    session.handle(ConfigurationReceived(newer))
    assert session.configuration is not None and list(session.configuration.reducers) == ["new"]
    assert session.effects() == [
        StoreConfiguration(key=keys.CONFIGURATION_KEY, text=_compact(newer))
    ]


def test_a_newer_cached_configuration_replaces_an_older_cached_one() -> None:
    session = Session()
    session.handle(ConfigurationReceived(configuration(reducer("old", ["m"])), from_cache=True))
    session.handle(ConfigurationReceived(configuration(reducer("new", ["m"])), from_cache=True))
    assert session.configuration is not None
    assert list(session.configuration.reducers) == ["new"]


@pytest.mark.parametrize(
    "payload",
    [
        None,
        "not json",
        {"reducers": "x"},
        {"reducers": [], "meters": [math.nan]},
        {"reducers": [], "meters": [object()]},
    ],
)
def test_unusable_configuration_is_rejected_and_changes_nothing(payload: object) -> None:
    session = configured()
    before = session.configuration
    session.reports()
    session.handle(ConfigurationReceived(payload))
    assert session.configuration is before
    assert session.rejections == {"configuration": 1}
    assert session.effects() == []
    [report] = session.reports()
    assert report.level == logging.WARNING
    assert report.message.startswith("outpost rejected configuration: unusable configuration")


def test_malformed_reducers_are_each_rejected_the_rest_is_used() -> None:
    payload = configuration(reducer("good", ["m"]))
    payload["reducers"] += [{"id": ""}, "junk"]
    session = Session()
    session.handle(ConfigurationReceived(payload))
    assert session.rejections == {"configuration": 2}
    assert session.configuration is not None and list(session.configuration.reducers) == ["good"]


def test_a_new_configuration_clears_cached_balances() -> None:
    session = configured()
    warm(session)
    assert session.cached_balance(COUNT, "c1", None) is not None
    session.handle(ConfigurationReceived(dict(STANDARD, organization_id="changed")))
    assert session.cached_balance(COUNT, "c1", None) is None


def test_warm_reads_are_counted_only_once_asked_and_survive_invalidation() -> None:
    session = configured()
    warm(session)
    session.cached_balance(COUNT, "c1", None)
    assert session.warm_reads() == {}  # not counting: nothing kept
    session.count_warm_reads()
    session.count_warm_reads()  # twice changes nothing
    for _ in range(3):
        session.cached_balance(COUNT, "c1", None)
    assert session.cached_balance(TOKENS, "c1", None) is None  # a miss is not a warm read
    assert session.warm_reads() == {(COUNT, "c1", None): 3}
    assert session.warm_reads() == {}  # each call reports what came since the last
    session.cached_balance(COUNT, "c1", None)
    # A change makes the balance stale: its count is kept until the next call.
    session.handle(ChangePublished(reply(delta(state("r-count"), 4, "n", "1"))))
    assert session.cached_balance(COUNT, "c1", None) is None
    session.read(COUNT, "c1")  # computed again
    session.cached_balance(COUNT, "c1", None)
    session.read(COUNT, "c1", fresh=True)  # replaces the cached one: its count is kept
    assert session.warm_reads() == {(COUNT, "c1", None): 2}
    session.cached_balance(COUNT, "c1", None)
    session.handle(ConfigurationReceived(dict(STANDARD, organization_id="changed")))
    assert session.warm_reads() == {(COUNT, "c1", None): 1}


# -- track ----------------------------------------------------------------------------------------


def test_track_needs_a_configuration() -> None:
    with pytest.raises(NotReady, match="no configuration"):
        track(Session())


def test_track_validates_before_it_needs_a_configuration() -> None:
    with pytest.raises(InvalidEvent, match="name"):
        track(Session(), name="")


def test_track_layout_for_an_identity_nobody_follows() -> None:
    session = configured()
    run = track(session)
    shard = keys.shard_of(C1)
    matching = ["r-count", "r-tokens", "r-largest", "r-smallest", "r-average"]
    assert run.script == "track"
    assert run.tag is None
    assert run.meter_ids == ("m-count", "m-tokens", "m-largest", "m-smallest", "m-average")
    expected_keys = [keys.outbox_key(shard)]
    for reducer_id in matching:
        expected_keys += [state(reducer_id), keys.bucket_key(state(reducer_id), BUCKET)]
    assert run.keys == tuple(expected_keys)
    assert run.args[:3] == (keys.channel(shard), f"{BUCKET}:e1", str(BUCKET))
    assert json.loads(run.args[3]) == {
        "name": "api_call",
        "external_customer_id": "c1",
        "external_id": "e1",
        "timestamp": "2026-12-02T15:00:42.000000Z",
        "metadata": {"tokens": 7},
    }
    assert json.loads(run.args[4]) == [state(r) for r in matching]
    assert run.args[5:] == ("-1", "1", "-1", "7", "-1", "7", "-1", "7", "-1", "7")
    assert all(isinstance(arg, str) for arg in run.args)
    assert session.effects() == []  # track() only returns the script


def test_track_json_is_compact_and_keeps_unicode() -> None:
    run = track(configured(), external_customer_id="ü:{x}", metadata={"note": "✓"})
    assert run.args[3] == (
        '{"name":"api_call","external_customer_id":"ü:{x}","external_id":"e1",'
        '"timestamp":"2026-12-02T15:00:42.000000Z","metadata":{"note":"✓"}}'
    )


def test_track_of_an_event_no_reducer_counts_still_queues_it() -> None:
    run = track(configured(), name="other_call", metadata={"tokens": "many"})
    assert run.keys == (keys.outbox_key(keys.shard_of(C1)),)
    assert run.meter_ids == ()
    assert run.args[4] == "[]"
    assert len(run.args) == 5


def test_track_sends_the_known_revision_of_loaded_copies() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(rev=12))
    run = track(session, name="other_call")  # counts in the four token reducers only
    assert run.keys[1] == state("r-tokens")
    assert run.args[5:7] == ("-1", "7")
    session.handle(IdentityLoaded(state("r-tokens"), {"rev": "3"}, 1))  # not followed: ignored
    run = track(session)
    assert run.args[5:7] == ("12", "1")  # r-count, followed and loaded
    session.handle(SubscriberRestarted())  # the copy reloads: its revision is unknown meanwhile
    assert track(session).args[5:7] == ("-1", "1")
    assert list(loads_asked(session)) == [state("r-count")]


def test_track_bucket_and_field() -> None:
    session = configured()
    run = track(session, timestamp_us=BUCKET - 1, event_id="a:b c")
    assert run.args[1:3] == (f"{BUCKET - 300_000_000}:a:b c", str(BUCKET - 300_000_000))


def test_track_refuses_a_future_timestamp_but_not_now() -> None:
    session = configured()
    with pytest.raises(InvalidEvent, match="future"):
        track(session, timestamp_us=NOW + 1)
    assert track(session, timestamp_us=NOW).args[2] == str(BUCKET)


def test_track_refuses_a_timestamp_before_1970() -> None:
    session = configured()
    with pytest.raises(InvalidEvent, match="before 1970"):
        track(session, timestamp_us=-1_500_000)
    assert track(session, timestamp_us=0).args[1:3] == ("0:e1", "0")


def test_track_refuses_values_whose_bucket_sums_could_overflow() -> None:
    session = configured()
    for tokens in (1e301, -1e301):
        with pytest.raises(InvalidEvent, match="r-tokens counts a value of"):
            track(session, metadata={"tokens": tokens})
    assert track(session, metadata={"tokens": -1e300}).args[7:9] == ("-1", "-1e+300")
    # A value no reducer counts is not summed anywhere: left for Polar to judge.
    assert track(session, metadata={"tokens": 1, "other": 1e308}).args[7:9] == ("-1", "1")


def test_track_lowercases_customer_ids() -> None:
    run = track(configured(), external_customer_id=None, customer_id=UUID.upper())
    customer = Customer("customer", UUID)
    assert run.keys[1] == state("r-count", customer)
    assert json.loads(run.args[3])["customer_id"] == UUID


def test_track_values_are_formatted_numbers() -> None:
    run = track(configured(), metadata={"tokens": 0.1})
    assert run.args[7:9] == ("-1", "0.1")  # r-tokens, after r-count
    run = track(configured(), metadata={"tokens": 2**60})
    assert run.args[7:9] == ("-1", repr(float(2**60)))


# -- reads ----------------------------------------------------------------------------------------


def test_read_before_any_configuration_is_none() -> None:
    session = Session()
    assert session.read(COUNT, "c1") is None
    assert session.effects() == []
    assert session.not_ready_reason(COUNT, "c1", None) == (
        "no configuration from Polar yet (WebSocket none)"
    )
    assert session.link_status() == ("none", None)


@pytest.mark.parametrize("meter", ["", None, 3])
def test_read_refuses_a_bad_meter_id(meter: Any) -> None:
    with pytest.raises(UsageError, match="meter_id"):
        configured().read(meter, "c1")


def test_read_refuses_a_bad_customer() -> None:
    session = configured()
    with pytest.raises(InvalidEvent, match="exactly one"):
        session.read(COUNT)
    with pytest.raises(InvalidEvent, match="UUID"):
        session.read(COUNT, customer_id="nope")


def test_unknown_and_unsupported_meters() -> None:
    session = configured()
    with pytest.raises(UnknownMeter, match="'nope' is not in Polar's configuration"):
        session.read("nope", "c1")
    with pytest.raises(UnsupportedMeter, match="'unique'"):
        session.read(UNIQUE, "c1")
    with pytest.raises(UnknownMeter):
        session.not_ready_reason("nope", "c1", None)
    assert issubclass(UnknownMeter, LookupError)


def test_first_read_loads_and_waits_for_the_copy() -> None:
    session = configured()
    assert session.read(COUNT, "c1") is None
    assert session.effects() == [LoadIdentity(key=state("r-count"), load_id=1)]
    assert [m.key for m in session.followed] == [state("r-count")]
    assert session.not_ready_reason(COUNT, "c1", None) == (
        "the local state of external:c1 could not be loaded from Redis"
    )
    # Asking again does not load twice.
    assert session.read(COUNT, "c1") is None
    assert session.effects() == []


def test_a_copy_without_snapshot_is_not_ready() -> None:
    session = configured()
    session.read(COUNT, "c1")
    load_id = load_asked(session, state("r-count"))
    fields = {"rev": "4", "n": "1", "a:0": "1 1 1 1"}
    session.handle(IdentityLoaded(state("r-count"), fields, load_id))
    assert session.read(COUNT, "c1") is None
    assert session.not_ready_reason(COUNT, "c1", None) == (
        "no snapshot for external:c1 in Redis yet (this instance has no access token)"
    )
    assert session.not_ready_reason(TOKENS, "c1", None).startswith("the local state")


def test_balance_of_a_loaded_copy() -> None:
    session = configured()
    fields = snapshot_fields(
        rev=7, n="2", u="1", extra={"a:1796223600000000": "2 10 3 7", "c:m-count": "25.5"}
    )
    balance = warm(session, fields=fields)
    assert balance == Balance(
        meter_id=COUNT,
        customer=C1,
        aggregation="count",
        balance=25.5 - 4,
        credited=25.5,
        consumed=4.0,
        polar=Aggregate(count=2, sum=5.0, min=1.0, max=4.0),
        local=Aggregate(count=2, sum=10.0, min=3.0, max=7.0),
        pending=2,
        undelivered=1,
        cold_until=from_us(BUCKET),
        snapshot_as_of=from_us(NOW - 1),
        snapshot_id=fields.get("sid"),
        revision=7,
        source="memory",
    )
    assert session.cached_balance(COUNT, "c1", None) is balance
    assert session.read(COUNT, "c1") == balance


@pytest.mark.parametrize(
    ("meter", "reducer_id", "consumed"),
    [
        (TOKENS, "r-tokens", 15.0),
        (LARGEST, "r-largest", 7.0),
        (SMALLEST, "r-smallest", 1.0),
        (AVERAGE, "r-average", 15.0 / 4),
    ],
)
def test_consumed_follows_the_aggregation(meter: str, reducer_id: str, consumed: float) -> None:
    session = configured()
    fields = snapshot_fields(extra={"a:1796223600000000": "2 10 3 7"})
    balance = warm(session, meter, reducer_id, fields)
    assert balance.consumed == consumed
    assert balance.credited == (100.0 if meter == TOKENS else 0.0)
    assert balance.balance == balance.credited - consumed


def test_a_meter_without_credits_has_zero_credited() -> None:
    balance = warm(configured(), fields=snapshot_fields(extra={"c:m-count": "0"}))
    assert (balance.credited, balance.consumed, balance.balance) == (0.0, 2.0, -2.0)


def test_read_by_customer_id() -> None:
    session = configured()
    customer = Customer("customer", UUID)
    balance = warm(session, customer=customer, customer_id=UUID)
    assert balance.customer == customer
    assert session.cached_balance(COUNT, None, UUID) is balance
    assert session.cached_balance(COUNT, UUID, None) is None


def test_cached_balance_is_none_until_a_read() -> None:
    session = configured()
    assert session.cached_balance(COUNT, "c1", None) is None
    session.read(COUNT, "c1")
    assert session.cached_balance(COUNT, "c1", None) is None


# -- following Redis, and reads from Redis -------------------------------------------------------


def test_a_first_read_before_any_subscription_waits_for_it() -> None:
    session = configured(subscribed=False)
    assert session.read(COUNT, "c1") is None
    key = state("r-count")
    load_id = load_asked(session, key)
    session.handle(IdentityLoaded(key, snapshot_fields(), load_id))
    # Loaded, but asked before Redis confirmed the subscription: changes may be missed.
    assert not session.followed[0].following
    assert session.read(COUNT, "c1") is None
    assert session.read(COUNT, "c1", fresh=True) == Fetch(keys=(key,))  # fresh never waits
    session.handle(SubscriberRestarted())
    assert (session.subscribed, session.ever_subscribed) == (True, True)
    session.handle(IdentityLoaded(key, snapshot_fields(), load_asked(session, key)))
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and balance.source == "memory"


def test_a_lost_subscription_sends_reads_to_redis_until_it_is_back() -> None:
    session = configured()
    before = warm(session, fields=snapshot_fields(rev=3))
    key = state("r-count")
    session.handle(SubscriberLost())
    assert (session.subscribed, session.ever_subscribed) == (False, True)
    assert session.effects() == []  # the copy is kept; nothing to load until subscribed again
    assert session.cached_balance(COUNT, "c1", None) is None
    assert session.read(COUNT, "c1") == Fetch(keys=(key,))
    fetched = session.read_fetched(
        COUNT, "c1", None, {state("r-count"): snapshot_fields(rev=5, n="1")}
    )
    assert fetched is not None and fetched.source == "redis"
    assert (fetched.revision, fetched.pending) == (5, 1)
    assert attrs.evolve(fetched, source="memory", revision=3, pending=0) == before
    assert session.cached_balance(COUNT, "c1", None) is None  # a fetched balance is not cached
    # The copy took the newer hash, but still does not follow.
    assert session.followed[0].rev == 5
    assert session.read(COUNT, "c1") == Fetch(keys=(key,))
    session.handle(SubscriberRestarted())
    reload = load_asked(session, key)
    assert session.read(COUNT, "c1") is None  # reloading
    session.handle(IdentityLoaded(key, snapshot_fields(rev=6), reload))
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and (balance.source, balance.revision) == ("memory", 6)


def test_a_load_asked_while_unsubscribed_does_not_follow() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    key = state("r-count")
    session.handle(SubscriberLost())
    session.handle(ChangePublished(reply(delta(key, 5, "n", "5"))))  # a gap: reload
    session.handle(IdentityLoaded(key, snapshot_fields(rev=5), load_asked(session, key)))
    assert session.followed[0].loaded
    assert session.read(COUNT, "c1") == Fetch(keys=(key,))


def test_a_subscription_lost_while_a_load_runs_leaves_the_copy_not_following() -> None:
    session = configured()
    session.read(COUNT, "c1")
    key = state("r-count")
    load_id = load_asked(session, key)
    session.handle(SubscriberLost())
    session.handle(IdentityLoaded(key, snapshot_fields(), load_id))
    assert session.read(COUNT, "c1") == Fetch(keys=(key,))


def test_a_fresh_read_always_fetches() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    key = state("r-count")
    assert session.read(COUNT, "c1", fresh=True) == Fetch(keys=(key,))
    fetched = session.read_fetched(COUNT, "c1", None, {state("r-count"): snapshot_fields(rev=3)})
    assert fetched is not None and (fetched.source, fetched.revision) == ("redis", 3)
    balance = session.read(COUNT, "c1")  # the copy still answers from memory
    assert isinstance(balance, Balance) and (balance.source, balance.revision) == ("memory", 3)


def test_a_fresh_read_waits_for_the_copy_and_the_snapshot_like_any_read() -> None:
    session = configured()
    assert session.read(COUNT, "c1", fresh=True) is None
    key = state("r-count")
    session.handle(IdentityLoaded(key, {"rev": "2"}, load_asked(session, key)))
    assert session.read(COUNT, "c1", fresh=True) is None  # no snapshot in the copy


def test_a_fetched_hash_newer_than_the_copy_updates_it() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    warm(session, TOKENS, "r-tokens", fields=snapshot_fields(rev=3))
    session.handle(SubscriberLost())
    copy = session.followed[0]
    fetched = session.read_fetched(
        COUNT, "c1", None, {state("r-count"): snapshot_fields(rev=9, n="4")}
    )
    assert fetched is not None and fetched.pending == 4
    assert (copy.rev, copy.fields["n"]) == (9, "4")
    older = session.read_fetched(
        COUNT, "c1", None, {state("r-count"): snapshot_fields(rev=2, n="1")}
    )
    assert older is not None and older.pending == 1  # the answer is what Redis said
    assert (copy.rev, copy.fields["n"]) == (9, "4")  # the copy does not go back


def test_a_fetched_hash_does_not_touch_a_copy_that_is_loading() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    key = state("r-count")
    session.handle(ScriptReplied(reply({"k": key, "r": 4})))  # reloads
    load_id = load_asked(session, key)
    fetched = session.read_fetched(COUNT, "c1", None, {state("r-count"): snapshot_fields(rev=8)})
    assert fetched is not None and fetched.revision == 8
    copy = session.followed[0]
    assert (copy.loaded, copy.rev) == (False, 3)
    session.handle(IdentityLoaded(key, snapshot_fields(rev=4), load_id))
    assert session.followed[0].rev == 4


def test_a_fetched_hash_without_revision_is_not_offered_to_the_copy() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    session.handle(SubscriberLost())
    fields = snapshot_fields()
    del fields["rev"]
    fetched = session.read_fetched(COUNT, "c1", None, {state("r-count"): fields})
    assert fetched is not None and fetched.revision == 0
    assert session.followed[0].rev == 3


def test_a_fetched_hash_for_a_customer_without_a_copy() -> None:
    # The driver fetched for a read, but the copy is not there any more (a new configuration).
    session = configured()
    fetched = session.read_fetched(
        COUNT, "c2", None, {state("r-count", Customer("external", "c2")): snapshot_fields(rev=3)}
    )
    assert fetched is not None and fetched.customer == Customer("external", "c2")
    assert session.followed == []


def test_a_fetched_hash_without_a_snapshot_is_not_a_balance() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    session.handle(SubscriberLost())
    assert (
        session.read_fetched(COUNT, "c1", None, {state("r-count"): {}}) is None
    )  # expired or wiped
    assert (
        session.read_fetched(COUNT, "c1", None, {state("r-count"): {"rev": "4", "n": "1"}}) is None
    )
    assert session.followed[0].rev == 4  # the copy still takes the newer hash


def test_a_fetched_hash_with_bytes_and_bad_fields() -> None:
    session = configured()
    fields: dict[object, object] = {k.encode(): v.encode() for k, v in snapshot_fields().items()}
    fields[b"\xff"] = b"1"
    fetched = session.read_fetched(COUNT, "c1", None, {state("r-count"): fields})
    assert fetched is not None and fetched.revision == 3
    assert session.rejections == {"state": 1}


def test_a_hash_fetched_again_unchanged_answers_the_same_and_a_changed_one_anew() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    key = state("r-count")
    fields = {k.encode(): v.encode() for k, v in snapshot_fields(rev=3, n="1").items()}
    first = session.read_fetched(COUNT, "c1", None, {key: fields})
    again = session.read_fetched(COUNT, "c1", None, {key: dict(fields)})
    assert first is not None and again == first and again.pending == 1
    # The same revision with other content (Redis lost writes and wrote that revision again):
    # the answer is what Redis holds now, never what an earlier fetch held.
    fields[b"n"] = b"2"
    changed = session.read_fetched(COUNT, "c1", None, {key: fields})
    assert changed is not None and (changed.revision, changed.pending) == (3, 2)


def test_a_hash_fetched_again_still_moves_a_copy_that_went_back_meanwhile() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    key = state("r-count")
    session.handle(SubscriberLost())
    newer = {k.encode(): v.encode() for k, v in snapshot_fields(rev=9, n="4").items()}
    assert session.read_fetched(COUNT, "c1", None, {key: newer}) is not None
    copy = session.followed[0]
    assert copy.rev == 9
    session.handle(SubscriberRestarted())  # the copy reloads, and Redis answers an older hash
    session.handle(IdentityLoaded(key, snapshot_fields(rev=2), load_asked(session, key)))
    assert copy.rev == 2
    assert session.read_fetched(COUNT, "c1", None, {key: dict(newer)}) is not None
    assert (copy.rev, copy.fields["n"]) == (9, "4")


def test_a_hash_with_a_field_refused_is_counted_once_however_often_it_is_fetched() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    fields: dict[object, object] = {k.encode(): v.encode() for k, v in snapshot_fields().items()}
    fields[b"\xff"] = b"1"
    for _ in range(3):  # a fresh read per call: one warning in all, not one per call
        assert session.read_fetched(COUNT, "c1", None, {state("r-count"): fields}) is not None
    assert session.rejections == {"state": 1}
    warnings = [r for r in session.reports() if r.level == logging.WARNING]
    assert len(warnings) == 1
    fields[b"\xff"] = b"2"  # other bytes: counted anew
    assert session.read_fetched(COUNT, "c1", None, {state("r-count"): fields}) is not None
    assert session.rejections == {"state": 2}


def test_a_fetched_read_by_customer_id() -> None:
    session = configured()
    fetched = session.read_fetched(
        COUNT, None, UUID.upper(), {state("r-count", Customer("customer", UUID)): snapshot_fields()}
    )
    assert fetched is not None and fetched.customer == Customer("customer", UUID)


# -- keeping copies current -----------------------------------------------------------------------


def test_the_track_reply_updates_the_copy_and_the_balance_at_once() -> None:
    session = configured()
    before = warm(session, fields=snapshot_fields(rev=3))
    assert before.consumed == 2
    run = track(session)
    assert run.args[5] == "3"
    key = state("r-count")
    session.handle(
        ScriptReplied(reply(delta(key, 4, f"a:{BUCKET}", "1 1 1 1", "n", "1", "u", "1")))
    )
    assert session.cached_balance(COUNT, "c1", None) is None  # invalidated
    after = session.read(COUNT, "c1")
    assert isinstance(after, Balance)
    assert (after.consumed, after.pending, after.undelivered, after.revision) == (3, 1, 1, 4)
    # The same change published on the channel is already applied.
    session.handle(ChangePublished(reply(delta(key, 4, f"a:{BUCKET}", "9 9 9 9")).encode("utf-8")))
    assert session.cached_balance(COUNT, "c1", None) is after
    assert session.effects() == []


def test_a_full_state_reply_replaces_the_copy() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    full = snapshot_fields(rev=9, n="5", extra={f"a:{BUCKET}": "5 5 1 1"})
    flat = [x for pair in full.items() for x in pair]
    session.handle(ScriptReplied(reply({"k": state("r-count"), "r": 9, "s": flat, "full": 1})))
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and (balance.revision, balance.consumed) == (9, 7)


def test_changes_of_identities_nobody_follows_are_ignored() -> None:
    session = configured()
    warm(session)
    session.handle(ChangePublished(reply(delta(state("r-tokens"), 1, "n", "1"))))
    session.handle(ChangePublished(reply(delta(state("r-count", Customer("external", "c2")), 9))))
    assert session.effects() == []
    assert session.cached_balance(COUNT, "c1", None) is not None


def test_a_duplicate_track_reply_changes_nothing() -> None:
    session = configured()
    warm(session)
    session.handle(ScriptReplied(b'{"dup":1}'))
    assert session.effects() == []
    assert session.rejections == {}
    assert session.cached_balance(COUNT, "c1", None) is not None


def test_a_bare_reply_newer_than_the_copy_reloads_it() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    session.handle(ScriptReplied(reply({"k": state("r-count"), "r": 3})))
    assert session.effects() == []  # nothing newer: the copy stays
    session.handle(ScriptReplied(reply({"k": state("r-count"), "r": 4})))
    load_asked(session, state("r-count"))
    assert session.read(COUNT, "c1") is None  # never served without what this instance wrote


def gap_after_3(rev: int) -> tuple[Session, str, int]:
    """c1's count copy, at revision 3, hears of revision ``rev`` (n is ``rev``) and reloads:
    the session, the copy's key and the load's number."""
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    key = state("r-count")
    session.handle(ChangePublished(reply(delta(key, rev, "n", str(rev)))))
    return session, key, load_asked(session, key)


def test_a_gap_reloads_the_copy_and_held_changes_follow() -> None:
    session, key, load_id = gap_after_3(5)
    session.handle(ChangePublished(reply(delta(key, 6, "n", "6"))))
    assert session.effects() == []  # held until the load
    session.handle(IdentityLoaded(key, snapshot_fields(rev=4, n="4"), load_id))
    assert session.effects() == []
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and (balance.revision, balance.pending) == (6, 6)


def test_a_load_that_leaves_a_gap_loads_again() -> None:
    session, key, first = gap_after_3(9)
    session.handle(IdentityLoaded(key, snapshot_fields(rev=5), first))  # 6..8 still missing
    second = load_asked(session, key)
    assert second > first
    session.handle(IdentityLoaded(key, snapshot_fields(rev=8), second))
    assert session.effects() == []
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and (balance.revision, balance.pending) == (9, 9)


def test_subscriber_restart_reloads_every_copy() -> None:
    session = configured()
    warm(session)
    warm(session, TOKENS, "r-tokens")
    session.handle(SubscriberRestarted())
    reloads = loads_asked(session)
    assert list(reloads) == [state("r-count"), state("r-tokens")]
    assert session.read(COUNT, "c1") is None  # not loaded until the reload answers
    reload = reloads[state("r-count")]
    session.handle(IdentityLoaded(state("r-count"), snapshot_fields(rev=20, n="3"), reload))
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and (balance.revision, balance.pending) == (20, 3)


def test_an_event_tracked_while_the_copy_reloads_is_never_hidden_by_the_cache() -> None:
    session = configured()
    before = warm(session, fields=snapshot_fields(rev=3))
    session.handle(SubscriberRestarted())
    session.effects()
    run = track(session)
    assert run.args[5] == "-1"
    session.handle(ScriptReplied(reply({"k": state("r-count"), "r": 4})))
    cached = session.cached_balance(COUNT, "c1", None)
    assert cached is None or cached.consumed == before.consumed + 1


def test_the_cache_of_an_upper_case_customer_id_is_invalidated() -> None:
    session = configured()
    customer = Customer("customer", UUID)
    warm(session, customer=customer, customer_id=UUID.upper())
    assert session.cached_balance(COUNT, None, UUID.upper()) is not None
    session.handle(ChangePublished(reply(delta(state("r-count", customer), 4, "n", "1"))))
    assert session.cached_balance(COUNT, None, UUID.upper()) is None


def test_changes_invalidate_the_balances_of_every_meter_of_the_reducer() -> None:
    shared = configuration(reducer("r", ["m1", "m2"]))
    session = configured(shared)
    warm(session, "m1", "r")
    assert session.read("m2", "c1") is not None
    session.handle(ChangePublished(reply(delta(state("r"), 4, "n", "1"))))
    assert session.cached_balance("m1", "c1", None) is None
    assert session.cached_balance("m2", "c1", None) is None


def test_a_change_for_a_reducer_that_left_the_configuration() -> None:
    session = configured()
    warm(session)
    session.handle(ConfigurationReceived(configuration(reducer("other", [COUNT]))))
    session.effects()
    session.handle(ChangePublished(reply(delta(state("r-count"), 4, "n", "1"))))
    assert session.effects() == []
    assert session.followed[0].rev == 4


def idle_deadline(session: Session) -> float:
    """When the least recently read customer is let go if not read again."""
    oldest = session._following.oldest()
    assert oldest is not None
    return oldest[1] + session.settings.idle_customer_ttl


def test_load_answers_for_keys_nobody_follows_are_ignored() -> None:
    session = configured()
    session.handle(IdentityLoaded("outpost:v2:{0}:external:x:r", {"rev": "1"}, 1))
    session.handle(LoadFailed("outpost:v2:{0}:external:x:r", 1))
    assert session.effects() == []
    assert session.next_deadline() is None


def test_a_failed_load_is_retried_with_backoff() -> None:
    # No generator and no link: the draw is the middle of the range (a delay of 3/4 the ceiling).
    session = configured(settings=Settings(reload_retry=2.0, reload_cap=5.0))
    session.handle(Tick(100.0))
    session.read(COUNT, "c1")
    key = state("r-count")
    load_id = load_asked(session, key)
    session.handle(LoadFailed(key, load_id))
    assert session.effects() == []
    assert session.next_deadline() == 100.0 + 2.0 * 0.75
    session.handle(Tick(101.4))
    assert session.effects() == []
    for failures, now in [(2, 101.5), (3, 101.5 + 4.0 * 0.75)]:
        session.handle(Tick(now))
        load_id = load_asked(session, key)
        session.handle(LoadFailed(key, load_id))
        ceiling = min(5.0, 2.0 * 2 ** (failures - 1))
        assert session.next_deadline() == now + ceiling * 0.75
    session.handle(Tick(200.0))
    load_id = load_asked(session, key)
    session.handle(IdentityLoaded(key, snapshot_fields(), load_id))
    assert session.next_deadline() == idle_deadline(session)  # no retry left
    session.handle(Tick(300.0))
    assert session.effects() == []
    # An answer resets the backoff: the next failure waits the first delay again.
    session.handle(ChangePublished(reply(delta(key, 9, "n", "9"))))
    session.handle(LoadFailed(key, load_asked(session, key)))
    assert session.next_deadline() == 300.0 + 2.0 * 0.75


def test_the_backoff_draws_from_the_sessions_generator() -> None:
    session = Session(Settings(reload_retry=1.0), rng=FixedRandom(0.0))
    session.handle(ConfigurationReceived(STANDARD, from_cache=True))
    session.handle(SubscriberRestarted())
    session.read(COUNT, "c1")
    session.handle(LoadFailed(state("r-count"), load_asked(session, state("r-count"))))
    assert session.next_deadline() == 0.5  # the lowest draw: half the ceiling


def test_only_due_retries_fire() -> None:
    session = configured()
    session.handle(Tick(10.0))
    session.read(COUNT, "c1")
    session.handle(LoadFailed(state("r-count"), load_asked(session, state("r-count"))))
    session.handle(Tick(10.2))
    session.read(TOKENS, "c1")
    session.handle(LoadFailed(state("r-tokens"), load_asked(session, state("r-tokens"))))
    assert session.next_deadline() == 10.375
    session.handle(Tick(10.5))
    assert list(loads_asked(session)) == [state("r-count")]
    assert session.next_deadline() == 10.575


def test_an_unanswered_load_is_asked_again_after_load_timeout() -> None:
    # A driver task cancelled mid-load loses its answer: the copy must not wait forever.
    session = configured(settings=Settings(load_timeout=4.0))
    session.handle(Tick(10.0))
    session.read(COUNT, "c1")
    key = state("r-count")
    first = load_asked(session, key)
    assert session.next_deadline() == 14.0
    session.handle(Tick(13.9))
    assert session.effects() == []
    session.handle(Tick(14.0))
    second = load_asked(session, key)
    assert second == first + 1
    assert session.next_deadline() == 18.0
    session.handle(IdentityLoaded(key, {}, first))  # the lost answer turns up: too old
    assert session.read(COUNT, "c1") is None
    assert session.next_deadline() == 18.0
    session.handle(IdentityLoaded(key, snapshot_fields(rev=4), second))
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and balance.revision == 4
    assert session.next_deadline() == idle_deadline(session)  # no retry left


def test_an_answer_to_an_older_load_never_moves_the_copy_back() -> None:
    # Load 1 read the hash before it existed; the subscriber restarted, load 2 read revision 7.
    session = configured()
    session.read(COUNT, "c1")
    key = state("r-count")
    stale = load_asked(session, key)
    session.handle(SubscriberRestarted())
    latest = load_asked(session, key)
    session.handle(IdentityLoaded(key, snapshot_fields(rev=7), latest))
    session.reports()
    session.handle(IdentityLoaded(key, {}, stale))
    ignored = f"outpost ignores load {stale} of {key} (load {latest} is newer)"
    assert session.reports() == [Report(logging.DEBUG, ignored)]
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and balance.revision == 7
    assert session.effects() == []


def test_a_failure_of_an_older_load_is_ignored() -> None:
    session = configured()
    session.handle(Tick(50.0))
    session.read(COUNT, "c1")
    key = state("r-count")
    stale = load_asked(session, key)
    session.handle(SubscriberRestarted())
    load_asked(session, key)
    session.handle(LoadFailed(key, stale))
    assert session.next_deadline() == 50.0 + Settings().load_timeout  # not a retry's


def test_a_load_answered_in_time_cancels_the_retry() -> None:
    session = configured()
    session.read(COUNT, "c1")
    session.handle(LoadFailed(state("r-count"), load_asked(session, state("r-count"))))
    assert session.next_deadline() is not None
    session.handle(SubscriberRestarted())
    session.handle(IdentityLoaded(state("r-count"), {}, load_asked(session, state("r-count"))))
    assert session.next_deadline() == idle_deadline(session)  # no retry left


# -- rejections -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff",
        None,
        "nope",
        "[]",
        '{"c":[{"r":1}]}',
        '{"c":[{"k":"KEY"}]}',
        '{"c":[{"k":"KEY","r":1,"s":["a"]}]}',
    ],
)
def test_unreadable_changes_are_rejected_not_raised(raw: object) -> None:
    session = configured()
    warm(session)
    if isinstance(raw, str):
        raw = raw.replace("KEY", state("r-count"))  # a key this session follows
    session.reports()
    session.handle(ChangePublished(raw))
    session.handle(ScriptReplied(raw))
    assert session.rejections == {"change": 2}
    reports = session.reports()
    assert [r.level for r in reports] == [logging.WARNING] * 2
    assert all(
        "outpost rejected change: unreadable change from Redis" in r.message for r in reports
    )
    assert session.cached_balance(COUNT, "c1", None) is not None


def test_changes_of_keys_not_followed_are_left_unread() -> None:
    # Every instance hears every change of a shard: what it does not follow, it does not parse
    # (a key is still needed to tell).
    session = configured()
    warm(session)
    session.handle(ChangePublished('{"c":[{"k":"not-followed","r":"x","s":7}]}'))
    assert session.rejections == {}
    assert session.cached_balance(COUNT, "c1", None) is not None


def test_non_utf8_state_fields_are_rejected_and_skipped() -> None:
    session = configured()
    session.read(COUNT, "c1")
    load_id = load_asked(session, state("r-count"))
    fields: dict[object, object] = {
        k.encode(): v.encode() for k, v in snapshot_fields(n="1").items()
    }
    fields[b"\xffbad"] = b"1"
    fields[b"u"] = b"\xfe"
    fields[b"x"] = 3  # neither text nor bytes
    session.handle(IdentityLoaded(state("r-count"), fields, load_id))
    assert session.rejections == {"state": 3}
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and (balance.pending, balance.undelivered) == (1, 0)


def test_unreadable_state_fields_are_rejected_on_each_load() -> None:
    session = configured()
    warm(session, fields=snapshot_fields(n="many", p="junk"))
    assert session.rejections == {"state": 2}
    warnings = [r.message for r in session.reports() if r.level == logging.WARNING]
    assert any("unreadable field n='many'" in message for message in warnings)
    session.handle(SubscriberRestarted())
    reload = load_asked(session, state("r-count"))
    session.handle(IdentityLoaded(state("r-count"), snapshot_fields(n="many"), reload))
    assert session.rejections == {"state": 3}


def test_a_gap_that_loads_keep_leaving_is_reloaded_with_backoff_not_at_once() -> None:
    # A change held from an incarnation of the hash that is gone: each load reads the empty
    # hash and the gap remains. The first reload is at once; the next ones back off.
    session = configured(settings=Settings(reload_retry=1.0, reload_cap=8.0))
    warm(session, fields=snapshot_fields(rev=3))
    key = state("r-count")
    session.handle(Tick(10.0))
    session.handle(ChangePublished(reply(delta(key, 9, "n", "9"))))
    first = load_asked(session, key)
    session.handle(IdentityLoaded(key, {}, first))
    second = load_asked(session, key)  # the first gap: at once
    session.handle(IdentityLoaded(key, {}, second))
    assert session.effects() == []  # the second: later
    assert session.next_deadline() == 10.0 + 2 * 1.0 * 0.75  # no generator: the middle draw
    session.handle(Tick(11.4))
    assert session.effects() == []
    session.handle(Tick(11.5))
    third = load_asked(session, key)
    session.handle(IdentityLoaded(key, snapshot_fields(rev=9), third))
    assert session.effects() == []
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and balance.revision == 9


def test_not_ready_says_when_only_the_subscription_is_missing() -> None:
    session = configured(subscribed=False)
    assert session.read(COUNT, "c1") is None
    key = state("r-count")
    session.handle(IdentityLoaded(key, snapshot_fields(), load_asked(session, key)))
    assert session.read(COUNT, "c1") is None  # a first read waits for the subscription
    reason = session.not_ready_reason(COUNT, "c1", None)
    assert reason == "Redis has not confirmed the subscription to the change channels yet"


def test_subscription_confirmations_decide_following() -> None:
    from outpost_core import SubscriptionConfirmed

    session = configured(subscribed=False)
    for count in range(1, len(keys.all_channels())):
        session.handle(SubscriptionConfirmed(count))
        assert not session.subscribed  # not until every channel is confirmed
    session.handle(SubscriptionConfirmed(len(keys.all_channels())))
    assert session.subscribed and session.ever_subscribed
    warm(session)
    # A client library re-subscribing by itself after a break starts again from 1.
    session.handle(SubscriptionConfirmed(1))
    assert not session.subscribed
    assert isinstance(session.read(COUNT, "c1"), Fetch)
    session.handle(SubscriptionConfirmed(len(keys.all_channels())))
    assert session.subscribed
    load_asked(session, state("r-count"))  # every copy reloads


def test_track_counts_the_buckets_it_writes() -> None:
    session = configured()
    run = track(session)
    assert run.buckets == len(run.meter_ids) == 5  # one identity per reducer that counts it
    assert run.buckets == (len(run.keys) - 1) // 2  # the script's KEYS: outbox, then pairs


def _customer_in_another_shard(than: Customer) -> Customer:
    return next(
        c
        for n in range(100)
        if keys.shard_of(c := Customer("external", f"c{n}")) != keys.shard_of(than)
    )


def test_a_lost_shard_channel_sends_only_that_shard_s_reads_to_redis_and_reloads_only_it() -> None:
    # On a cluster each shard is subscribed on the node that owns it: a node's fail-over breaks
    # the channels of its shards only, and only their copies may have missed a message.
    session = configured()
    other = _customer_in_another_shard(C1)
    warm(session, fields=snapshot_fields(rev=3))
    warm(session, customer=other, fields=snapshot_fields(rev=7))
    lost = keys.channel(keys.shard_of(C1))
    session.handle(ChannelsLost((lost.encode(),)))
    assert (session.subscribed, session.ever_subscribed) == (False, True)
    assert session.effects() == []  # nothing reloads until the channel is back
    assert session.read(COUNT, "c1") == Fetch(keys=(state("r-count"),))
    untouched = session.read(COUNT, other.id)  # the other shard's copy still follows
    assert isinstance(untouched, Balance) and untouched.source == "memory"
    session.handle(ChannelSubscribed(lost))
    assert session.subscribed
    reload = load_asked(session, state("r-count"))  # that shard's copy only
    session.handle(IdentityLoaded(state("r-count"), snapshot_fields(rev=4), reload))
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and (balance.source, balance.revision) == ("memory", 4)


def test_shard_channels_confirmed_one_by_one_make_the_subscription_whole() -> None:
    session = configured(subscribed=False)
    warm_key = state("r-count")
    assert session.read(COUNT, "c1") is None
    load_id = load_asked(session, warm_key)
    for shard in range(keys.DEFAULT_SHARDS):
        if shard != keys.shard_of(C1):
            session.handle(ChannelSubscribed(keys.channel(shard)))
    assert not session.subscribed and session.effects() == []  # c1's shard is not confirmed
    session.handle(IdentityLoaded(warm_key, snapshot_fields(), load_id))
    assert not session.followed[0].following  # asked before its shard was subscribed
    session.handle(ChannelSubscribed(keys.channel(keys.shard_of(C1))))
    assert (session.subscribed, session.ever_subscribed) == (True, True)
    session.handle(IdentityLoaded(warm_key, snapshot_fields(), load_asked(session, warm_key)))
    assert session.followed[0].following


def test_a_channel_that_is_not_ours_is_rejected_and_changes_nothing() -> None:
    session = configured()
    warm(session)
    session.handle(ChannelsLost(("someone:else", b"\xff")))
    session.handle(ChannelSubscribed(keys.channel(3, "db2")))  # another database's channel
    assert session.rejections["subscription"] == 3
    assert session.subscribed and session.effects() == []


def test_the_status_of_an_instance_without_a_token_has_no_websocket() -> None:
    session = Session()
    assert session.status(redis_error=None, delivery_stalled=None) == Status(
        "none", None, False, None, None
    )
    session.handle(SubscriberRestarted())
    assert session.status(redis_error="Connection refused", delivery_stalled="no token") == Status(
        "none", None, True, "Connection refused", "no token"
    )


# -- the deployment's shard count ------------------------------------------------------------


C2 = Customer("external", "c2")  # shard 0 of 16, 48 of 64


def test_a_session_of_64_shards_writes_each_customer_under_its_shard_of_64() -> None:
    session = configured(settings=Settings(shards=64))
    run = track(session, external_customer_id="c2")
    wide = keys.state_key(C2, "r-count", 64)
    assert wide.startswith("outpost:v2:{48}:") and wide in run.keys
    assert run.keys[0] == keys.outbox_key(48)
    assert run.args[0] == keys.channel(48)
    narrow = track(configured(), external_customer_id="c2")
    assert narrow.keys[0] == keys.outbox_key(0) and narrow.args[0] == keys.channel(0)
    assert session.shard_of(C2) == 48


def test_a_session_of_64_shards_is_subscribed_once_its_64_channels_are() -> None:
    from outpost_core import SubscriptionConfirmed

    session = Session(Settings(shards=64))
    session.handle(SubscriptionConfirmed(16))
    assert not session.subscribed  # 16 of 64
    session.handle(SubscriptionConfirmed(64))
    assert session.subscribed
    session = Session(Settings(shards=64))
    for shard in range(63):
        session.handle(ChannelSubscribed(keys.channel(shard)))
    assert not session.subscribed
    session.handle(ChannelSubscribed(keys.channel(63)))
    assert session.subscribed and session.rejections == {}


def test_a_channel_beyond_the_deployment_s_count_is_none_of_ours() -> None:
    session = Session(Settings(shards=16))
    session.handle(ChannelSubscribed(keys.channel(40)))
    assert session.rejections["subscription"] == 1


@pytest.mark.parametrize("count", [0, -1, keys.MAX_SHARDS + 1, True, 16.0, "16"])
def test_a_shard_count_out_of_range_is_refused(count: Any) -> None:
    from outpost_core import ConfigurationError

    with pytest.raises(ConfigurationError, match="shards must be"):
        Settings(shards=count)
