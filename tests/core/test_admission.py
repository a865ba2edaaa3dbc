"""Exact admission in the core: the reserve, release and admit scripts' calls, their refusals,
and holds in reads (``Balance.held``, ``available``, expiry). No I/O: Redis's answers are given
by hand."""

from __future__ import annotations

import json
from typing import Any

import pytest

from outpost_core import (
    Balance,
    CannotAdmit,
    ChangePublished,
    ConfigurationReceived,
    Customer,
    IdentityLoaded,
    InsufficientBalance,
    LoadIdentity,
    Session,
    SubscriberRestarted,
    Tick,
    UnknownMeter,
    UnsupportedMeter,
    UsageError,
    admission,
)
from outpost_core import _keys as keys
from outpost_core._balance import hold_expiry, merged_state
from outpost_core._mirror import derive_state
from tests.core._payloads import COUNT, LARGEST, STANDARD, TOKENS
from tests.core.test_aliases import UUID, X, alias_named

E = Customer("external", "c1")
NOW = 1_796_223_600_000_000
STATE = keys.state_key(E, "r-count")
TOKENS_STATE = keys.state_key(E, "r-tokens")


def ready(fields: dict[str, str] | None = None, meter: str = COUNT) -> tuple[Session, Balance]:
    """A session without a link, subscribed, whose copy of E's count identity loaded ``fields``
    (a snapshot crediting 10), and its first read."""
    session = Session()
    session.handle(ConfigurationReceived(STANDARD, from_cache=True))
    session.handle(SubscriberRestarted())
    session.handle(Tick(1.0, NOW))
    assert session.read(meter, "c1") is None
    [load] = [e for e in session.effects() if isinstance(e, LoadIdentity)]
    base = {"rev": "3", "cu": str(NOW), "sa": str(NOW), "sid": "s", "p": "2 2 1 1"}
    base |= {f"c:{COUNT}": "10", f"c:{TOKENS}": "10"}
    session.handle(IdentityLoaded(load.key, base | (fields or {}), load.load_id))
    balance = session.read(meter, "c1")
    assert isinstance(balance, Balance)
    return session, balance


# -- reading holds ---------------------------------------------------------------------------


def test_a_read_counts_the_holds_that_have_not_expired() -> None:
    session, balance = ready({"h:a": f"3 {NOW + 10}", "h:b": f"1.5 {NOW}", "h:c": f"2 {NOW + 5}"})
    # The hold expiring at the read's clock no longer counts.
    assert (balance.balance, balance.held, balance.available) == (8, 5, 3)
    assert session.cached_balance(COUNT, "c1", None) is balance
    # The first hold's expiry is a deadline: the cached balance goes stale then.
    assert session.next_deadline() == pytest.approx(1.0 + 5 / 1e6)
    session.handle(Tick(1.5, NOW + 4))
    assert session.cached_balance(COUNT, "c1", None) is balance
    session.handle(Tick(2.0, NOW + 5))
    assert session.cached_balance(COUNT, "c1", None) is None
    later = session.read(COUNT, "c1")
    assert isinstance(later, Balance) and later.held == 3
    session.handle(Tick(3.0, NOW + 10))
    # No hold is left to expire: what is due next is letting the idle customer go.
    assert session.next_deadline() == pytest.approx(3.0 + session.settings.idle_customer_ttl)
    assert session.read(COUNT, "c1").held == 0  # type: ignore[union-attr]


def test_a_hold_travels_like_a_track_and_a_fetched_read_counts_it() -> None:
    session, balance = ready()
    # Nothing held, so nothing expires: what is due next is letting the idle customer go.
    assert balance.held == 0
    assert session.next_deadline() == pytest.approx(1.0 + session.settings.idle_customer_ttl)
    message = {"c": [{"k": STATE, "r": 4, "s": ["h:x", f"4 {NOW + 9}"], "d": []}]}
    session.handle(ChangePublished(json.dumps(message)))
    assert session.read(COUNT, "c1").available == 4  # type: ignore[union-attr]
    fields = {b"rev": b"4", b"cu": str(NOW).encode(), f"c:{COUNT}".encode(): b"10"}
    fields[b"h:x"] = f"4 {NOW + 9}".encode()
    fetched = session.read_fetched(COUNT, "c1", None, {STATE: fields})
    assert fetched is not None and (fetched.source, fetched.held) == ("redis", 4)


def test_malformed_holds_are_problems_and_count_nothing() -> None:
    state = derive_state({"rev": "1", "h:a": "x 5", "h:b": "1", "h:c": "-1 9", "h:d": "2 9"})
    assert state.holds == ((2.0, 9),)
    assert [p.split("=")[0] for p in state.problems] == ["h:a", "h:b", "h:c"]


def test_every_name_s_holds_count() -> None:
    own = derive_state({"rev": "1", "h:a": "1 9"})
    other = derive_state({"rev": "1", "h:b": "2 7"})
    merged = merged_state(own, [other])
    assert merged.holds == ((1.0, 9), (2.0, 7))
    assert (hold_expiry(merged, 0), hold_expiry(merged, 7), hold_expiry(merged, 9)) == (7, 9, None)


def test_ready_means_loaded_with_a_snapshot_and_the_other_names_loaded() -> None:
    session = Session()
    assert not admission.ready(session, COUNT, "c1", None)  # no configuration
    session.handle(ConfigurationReceived(STANDARD, from_cache=True))
    assert not admission.ready(session, "m-nope", "c1", None)
    assert not admission.ready(session, COUNT, "c1", None)  # no copy
    session, _ = ready()
    assert admission.ready(session, COUNT, "c1", None)
    bare = Session()
    bare.handle(ConfigurationReceived(STANDARD, from_cache=True))
    assert bare.read(COUNT, "c1") is None
    [load] = [e for e in bare.effects() if isinstance(e, LoadIdentity)]
    bare.handle(IdentityLoaded(load.key, {"rev": "1"}, load.load_id))
    assert not admission.ready(bare, COUNT, "c1", None)  # no snapshot
    polar = alias_named()
    assert not admission.ready(polar.session, COUNT, "c1", None)  # X's copy not loaded
    polar.load(X, {"rev": "1", "cu": "5"})
    assert admission.ready(polar.session, COUNT, "c1", None)
    # X's own hash holds a snapshot, but this instance has not applied Polar's for X yet.
    assert not admission.ready(polar.session, COUNT, None, UUID)


# -- reserve and release ---------------------------------------------------------------------


def test_reserve_calls_the_script_with_the_meter_s_credits_and_the_copy_s_revision() -> None:
    session, _ = ready()
    run, hold = admission.reserve(session, COUNT, 2, "c1", None, ttl=1.5, now_us=NOW, hold_id="h1")
    assert hold == admission.Hold(COUNT, E, STATE, "h:h1", 2.0, NOW + 1_500_000)
    assert run.script == "reserve" and run.keys == (STATE,)
    channel = keys.channel(keys.shard_of(E))
    assert run.args == (channel, str(NOW), "h:h1", "2", str(NOW + 1_500_000), "count",
                        f"c:{COUNT}", "3")  # fmt: skip
    released = admission.release(session, hold, NOW + 1)
    assert released.keys == (STATE,)
    assert released.args == (channel, str(NOW + 1), "h:h1", "3")


@pytest.mark.parametrize(
    ("units", "ttl"), [(0, 1), (-1, 1), (True, 1), ("1", 1), (float("inf"), 1), (1, 0), (1, "x")]
)
def test_reserve_refuses_bad_units_and_ttl(units: Any, ttl: Any) -> None:
    session, _ = ready()
    with pytest.raises(UsageError):
        admission.check_request(units, ttl)
    with pytest.raises(UsageError):
        admission.reserve(session, COUNT, units, "c1", None, ttl=ttl, now_us=NOW, hold_id="h")


def test_only_known_meters_that_add_up_take_reservations() -> None:
    session, _ = ready()
    with pytest.raises(UnsupportedMeter, match="count and sum"):
        admission.reserve(session, LARGEST, 1, "c1", None, ttl=1, now_us=NOW, hold_id="h")
    with pytest.raises(UnknownMeter):
        admission.reserve(session, "m-nope", 1, "c1", None, ttl=1, now_us=NOW, hold_id="h")
    with pytest.raises(UnknownMeter):
        admission.reserve(Session(), COUNT, 1, "c1", None, ttl=1, now_us=NOW, hold_id="h")


def test_a_customer_s_other_names_count_and_on_a_cluster_must_share_its_slot() -> None:
    polar = alias_named()
    assert keys.shard_of(E) != keys.shard_of(X)
    run, _ = admission.reserve(polar.session, COUNT, 1, "c1", None, ttl=1, now_us=NOW, hold_id="h")
    assert run.keys == (STATE, keys.state_key(X, "r-count"))
    with pytest.raises(CannotAdmit, match=UUID):
        admission.reserve(
            polar.session, COUNT, 1, "c1", None, ttl=1, now_us=NOW, hold_id="h", one_slot=True
        )


# -- admit -----------------------------------------------------------------------------------


def track(session: Session, tokens: float | None = 5, event_id: str = "e1") -> Any:
    metadata = {} if tokens is None else {"tokens": tokens}
    return session.track(
        name="api_call",
        external_customer_id="c1",
        metadata=metadata,
        timestamp_us=NOW,
        now_us=NOW,
        event_id=event_id,
    )


def test_admit_without_conditions_is_track_with_no_checks() -> None:
    session, _ = ready()
    run = track(session, tokens=None)
    admitted, asks = admission.admit(session, run, E, now_us=NOW + 1)
    assert asks == {}
    assert admitted.script == "admit" and admitted.keys == run.keys
    assert admitted.args[:5] == run.args[:5]
    assert admitted.args[5:] == (str(NOW + 1), "1", "", "0", "-1", "3", "1", "", "0", "0")


def test_require_balance_checks_every_meter_and_names_the_other_names() -> None:
    polar = alias_named()
    session = polar.session
    x_state = keys.state_key(X, "r-count")
    run_count = track(session, tokens=None, event_id="e2")
    admitted, asks = admission.admit(session, run_count, E, now_us=NOW, require_balance=True)
    assert asks == {COUNT: 1.0}
    assert admitted.keys == (*run_count.keys, x_state)
    assert admitted.args[7:] == ("", "0", "-1", "1", "1", "count", "1", f"c:{COUNT}", "1", "4")
    with pytest.raises(CannotAdmit):
        admission.admit(session, run_count, E, now_us=NOW, require_balance=True, one_slot=True)


def test_require_balance_refuses_an_event_that_counts_in_a_meter_that_cannot_admit() -> None:
    session, _ = ready()
    run = track(session, tokens=5)
    with pytest.raises(UnsupportedMeter):
        admission.admit(session, run, E, now_us=NOW, require_balance=True)


def test_a_commit_releases_its_hold_in_the_same_script() -> None:
    session, _ = ready()
    _, hold = admission.reserve(session, COUNT, 1, "c1", None, ttl=1, now_us=NOW, hold_id="h")
    run = track(session, tokens=None)
    admitted, _ = admission.admit(session, run, E, now_us=NOW, hold=hold)
    # the hold's hash is the first identity's: KEYS[2]
    assert admitted.args[7:10] == ("h:h", "2", "3")
    assert admitted.keys == run.keys
    # An event that does not count in the hold's reducer: the hash comes as one more key.
    _, other = admission.reserve(session, TOKENS, 1, "c1", None, ttl=1, now_us=NOW, hold_id="t")
    admitted, _ = admission.admit(session, run, E, now_us=NOW, hold=other)
    assert admitted.keys == (*run.keys, TOKENS_STATE)
    assert admitted.args[7:10] == ("h:t", str(len(run.keys) + 1), "-1")


# -- refusals --------------------------------------------------------------------------------


def test_a_refusal_is_read_from_the_script_s_reply() -> None:
    refusal = admission.refusal_of(b'{"no":["m",  "10", "4.5"]}')
    assert refusal == admission.Refusal("m", 10.0, 4.5)
    error = refusal.error(7)
    assert isinstance(error, InsufficientBalance)
    assert (error.meter_id, error.units, error.balance, error.held, error.available) == (
        "m",
        7,
        10,
        4.5,
        5.5,
    )
    assert "7 units asked, 5.5 available" in str(error)


@pytest.mark.parametrize(
    "reply",
    [
        '{"c":[]}',
        '{"dup":1}',
        ["a", "b"],
        None,
        b"\xff",
        '{"no":[1,"1","1"]}',
        '{"no":["m",1,"1"]}',
        '{"no":["m","1",null]}',
        '{"no":["m","x","1"]}',
        '{"no":["m","1"]}',
        '{"no":',
    ],
)
def test_other_replies_are_no_refusal(reply: object) -> None:
    assert admission.refusal_of(reply) is None


def test_a_hold_that_expires_after_its_customer_was_let_go_is_forgotten() -> None:
    session, _ = ready({"h:a": f"3 {NOW + 10}"})
    idle = session.settings.idle_customer_ttl
    for turn in (1, 2):  # idle (the first look sees its earlier warm read): let go
        session.handle(Tick(1.0 + turn * (idle + 1), NOW + turn))
    assert session.followed == []  # its hold has not expired yet
    session.handle(Tick(4.0 + 2 * idle, NOW + 11))  # the hold's expiry finds no copy to invalidate
    assert session.next_deadline() is None
