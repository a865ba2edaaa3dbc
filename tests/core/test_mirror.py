"""The in-memory copy of an identity hash, in revision order (``_mirror``)."""

from __future__ import annotations

import pytest

from outpost_core import Aggregate, Customer
from outpost_core._changes import Change
from outpost_core._mirror import IdentityState, Mirror, Offer, derive_state

C1 = Customer("external", "c1")


def mirror() -> Mirror:
    return Mirror("s1", C1, "r1")


def delta(rev: int, *pairs: tuple[str, str], deleted: tuple[str, ...] = ()) -> Change:
    return Change(key="s1", rev=rev, set=tuple(pairs), deleted=deleted)


def full(rev: int, *pairs: tuple[str, str]) -> Change:
    return Change(key="s1", rev=rev, set=tuple(pairs), full=True)


def without_rev(fields: dict[str, str]) -> dict[str, str]:
    """A delta does not carry the hash's ``rev`` field (the revision is ``r``)."""
    return {name: value for name, value in fields.items() if name != "rev"}


def load(m: Mirror, fields: dict[str, str], *, follows: bool = False) -> bool | None:
    """Ask for a load and answer it at once with ``fields``."""
    return m.loaded_with(fields, m.start_load(follows))


def loaded(rev: int = 5, **fields: str) -> Mirror:
    m = mirror()
    assert load(m, {"rev": str(rev), **fields})
    return m


def test_a_new_mirror_is_not_loaded() -> None:
    m = mirror()
    assert (m.key, m.customer, m.reducer_id) == ("s1", C1, "r1")
    assert (m.rev, m.fields, m.loaded, m.held) == (-1, {}, False, [])
    assert (m.load_id, m.load_follows, m.following) == (0, False, False)


def test_changes_before_the_load_are_held() -> None:
    m = mirror()
    change = delta(1, ("n", "1"))
    assert m.offer(change) is Offer.HELD
    assert m.held == [change]
    assert m.fields == {}


def test_a_change_without_content_is_ignored_unless_it_is_newer() -> None:
    bare = Change(key="s1", rev=6, set=None)
    m = mirror()
    assert m.offer(bare) is Offer.IGNORED  # loading: the load brings it
    assert m.held == []
    m = loaded(6)
    assert m.offer(bare) is Offer.IGNORED  # already there
    assert (m.rev, m.loaded) == (6, True)
    m = loaded(5)
    # Something this instance wrote is newer than the copy: reload rather than hide it.
    assert m.offer(bare) is Offer.GAP
    assert (m.rev, m.loaded) == (5, False)


def test_the_next_revision_applies_in_place() -> None:
    m = loaded(5, n="1", u="1", **{"a:0": "1 1 1 1"})
    assert m.offer(delta(6, ("n", "2"), ("a:300", "1 2 2 2"), deleted=("a:0", "nope"))) is (
        Offer.APPLIED
    )
    assert m.rev == 6
    assert without_rev(m.fields) == {"n": "2", "u": "1", "a:300": "1 2 2 2"}


@pytest.mark.parametrize("rev", [3, 5])
def test_an_older_or_equal_delta_is_ignored(rev: int) -> None:
    m = loaded(5, n="1")
    assert m.offer(delta(rev, ("n", "9"))) is Offer.IGNORED
    assert (m.rev, m.fields["n"], m.loaded) == (5, "1", True)


def test_a_gap_unloads_and_holds_the_change() -> None:
    m = loaded(5, n="1")
    change = delta(7, ("n", "3"))
    assert m.offer(change) is Offer.GAP
    assert not m.loaded
    assert m.held == [change]
    assert (m.rev, m.fields["n"]) == (5, "1")  # untouched until the reload
    # Later changes wait for the reload too.
    assert m.offer(delta(8, ("n", "4"))) is Offer.HELD


@pytest.mark.parametrize("rev", [6, 9])
def test_a_newer_full_state_replaces_the_copy(rev: int) -> None:
    m = loaded(5, n="1", u="1")
    assert m.offer(full(rev, ("n", "7"))) is Offer.APPLIED
    assert (m.rev, m.fields, m.loaded) == (rev, {"n": "7"}, True)


@pytest.mark.parametrize("rev", [4, 5])
def test_a_full_state_not_newer_is_ignored(rev: int) -> None:
    # The copy's own revision is the same content: applying it again would only drop the
    # derived state and the cached balance (a fresh read did, every time).
    m = loaded(5, n="1")
    state = m.state
    assert m.offer(full(rev, ("n", "0"))) is Offer.IGNORED
    assert (m.rev, m.fields) == (5, {"rev": "5", "n": "1"})
    assert m.state is state


def test_unload_keeps_the_copy_but_holds_changes() -> None:
    m = loaded(5, n="1")
    m.unload()
    assert not m.loaded
    assert m.fields == {"rev": "5", "n": "1"}
    assert m.offer(delta(6, ("n", "2"))) is Offer.HELD


def test_held_changes_apply_in_revision_order_after_the_load() -> None:
    m = mirror()
    for change in (delta(8, ("n", "8")), delta(6, ("n", "6")), delta(7, ("u", "7"))):
        assert m.offer(change) is Offer.HELD
    assert load(m, {"rev": "5", "n": "5"})
    assert (m.rev, m.loaded, m.held) == (8, True, [])
    assert without_rev(m.fields) == {"n": "8", "u": "7"}


def test_held_changes_the_load_already_has_are_ignored() -> None:
    m = mirror()
    m.offer(delta(4, ("n", "old")))
    m.offer(delta(5, ("n", "five")))
    m.offer(delta(6, ("n", "six")))
    assert load(m, {"rev": "5", "n": "five"})
    assert (m.rev, m.fields["n"]) == (6, "six")


def test_a_gap_during_the_held_replay_keeps_the_rest_and_asks_for_a_reload() -> None:
    m = mirror()
    later = [delta(7, ("n", "7")), delta(9, ("n", "9")), delta(9, ("n", "9")), delta(10)]
    for change in [delta(6, ("n", "6")), *later]:
        m.offer(change)
    assert not load(m, {"rev": "5"})
    assert not m.loaded
    assert m.rev == 7  # 6 and 7 applied before the gap at 9
    assert m.fields["n"] == "7"
    assert [c.rev for c in m.held] == [9, 10]  # the duplicate 9 is gone
    # The reload brings the missing revision 8.
    assert load(m, {"rev": "8", "n": "8"})
    assert (m.rev, m.fields["n"], m.held) == (10, "9", [])


def test_held_full_states_replace_the_loaded_copy() -> None:
    m = mirror()
    m.offer(full(7, ("n", "7")))
    assert load(m, {"rev": "5", "n": "5"})
    assert (m.rev, m.fields) == (7, {"n": "7"})


def test_a_load_older_than_the_copy_was_when_asked_is_installed() -> None:
    m = loaded(5, n="5")
    assert m.offer(delta(6, ("n", "6"))) is Offer.APPLIED
    assert load(m, {"rev": "4", "n": "4"})  # Redis lost revisions 5 and 6
    assert (m.rev, m.fields["n"], m.loaded) == (4, "4", True)
    assert load(m, {"rev": "9", "n": "9"})
    assert (m.rev, m.fields) == (9, {"rev": "9", "n": "9"})


def test_a_repeated_answer_to_the_latest_load_is_installed_as_any_load() -> None:
    m = mirror()
    load_id = m.start_load(False)
    assert m.loaded_with({"rev": "5", "n": "5"}, load_id)
    assert m.offer(delta(6, ("n", "6"))) is Offer.APPLIED
    assert m.loaded_with({"rev": "5", "n": "5"}, load_id)  # older than the copy: kept
    assert (m.rev, m.fields["n"], m.loaded) == (6, "6", True)


# -- numbered loads --------------------------------------------------------------------------------


def test_each_load_has_a_new_number_and_unloads_the_copy() -> None:
    m = loaded(5, n="5")
    first = m.load_id
    second = m.start_load(False)
    assert second == first + 1 == m.load_id
    assert not m.loaded
    assert m.offer(delta(6, ("n", "6"))) is Offer.HELD


def test_an_answer_to_an_older_load_is_ignored() -> None:
    # Load 1 read the hash before it existed; load 2 read it at revision 7. Load 1 answers last.
    m = mirror()
    stale = m.start_load(False)
    latest = m.start_load(False)
    assert m.loaded_with({"rev": "7", "n": "7"}, latest)
    assert m.offer(delta(8, ("n", "8"))) is Offer.APPLIED
    assert m.loaded_with({}, stale) is None
    assert (m.rev, m.fields["n"], m.loaded) == (8, "8", True)


def test_an_older_load_answering_first_leaves_the_copy_waiting() -> None:
    m = loaded(3, n="3")
    stale = m.start_load(False)
    m.offer(delta(4, ("n", "4")))
    latest = m.start_load(False)
    assert m.loaded_with({"rev": "1", "n": "1"}, stale) is None
    assert (m.loaded, m.rev, [c.rev for c in m.held]) == (False, 3, [4])
    assert m.loaded_with({"rev": "4", "n": "4"}, latest)
    assert (m.loaded, m.rev, m.held) == (True, 4, [])


def test_an_answer_to_a_load_never_asked_is_ignored() -> None:
    m = mirror()
    assert m.loaded_with({"rev": "1"}, 1) is None
    assert not m.loaded


# -- following ------------------------------------------------------------------------------------


def test_a_copy_follows_when_its_load_was_asked_while_subscribed() -> None:
    m = mirror()
    assert load(m, {"rev": "1"}, follows=True)
    assert m.following
    assert load(m, {"rev": "2"}, follows=False)
    assert not m.following


def test_a_copy_does_not_follow_before_its_load_answers() -> None:
    m = mirror()
    load_id = m.start_load(True)
    assert (m.load_follows, m.following) == (True, False)
    assert m.loaded_with({"rev": "1"}, load_id)
    assert m.following


def test_stop_following_also_covers_the_load_in_flight() -> None:
    # The subscription broke while the load ran: changes after it may be lost.
    m = mirror()
    load_id = m.start_load(True)
    m.stop_following()
    assert m.loaded_with({"rev": "1"}, load_id)
    assert (m.loaded, m.following) == (True, False)
    m = loaded(1)
    m.following = True
    m.stop_following()
    assert (m.loaded, m.following, m.load_follows) == (True, False, False)


def test_a_hash_gone_back_in_time_replaces_the_copy() -> None:
    # Redis lost revisions 46 to 50 (a fail-over before they reached the replica): the copy
    # follows it there, and the changes written after (46 again, 47) apply.
    m = loaded(50, n="50")
    load_id = m.start_load(False)
    assert m.offer(delta(46, ("n", "46"))) is Offer.HELD
    assert m.loaded_with({"rev": "45", "n": "45"}, load_id)
    assert (m.rev, m.fields["n"], m.loaded) == (46, "46", True)
    assert m.offer(delta(47, ("n", "47"))) is Offer.APPLIED


def test_a_hash_recreated_below_the_copy_replaces_it_and_a_held_change_past_it_reloads() -> None:
    # Wiped and written again from Redis's clock, which the old revisions had outrun.
    m = loaded(50, n="50")
    load_id = m.start_load(False)
    m.offer(Change(key="s1", rev=51, set=(("n", "51"),)))  # an old echo, come late
    assert m.loaded_with({"rev": "20", "n": "1"}, load_id) is False  # 51 after 20: a gap
    assert (m.rev, m.fields["n"], m.loaded) == (20, "1", False)


def test_a_hash_that_is_gone_replaces_the_copy() -> None:
    # Expired or wiped: no revision at all. (Written again, it starts from Redis's clock.)
    m = loaded(50, n="50")
    assert load(m, {})
    assert (m.rev, m.fields, m.loaded) == (0, {}, True)


@pytest.mark.parametrize("fields", [{}, {"rev": "x"}, {"rev": ""}])
def test_a_missing_or_unreadable_revision_loads_as_zero(fields: dict[str, str]) -> None:
    m = mirror()
    assert load(m, fields)
    assert m.rev == 0
    assert m.offer(delta(1, ("n", "1"))) is Offer.APPLIED


def test_an_unreadable_revision_is_a_problem() -> None:
    m = mirror()
    load(m, {"rev": "x"})
    assert m.state.problems == ("rev='x'",)


def test_state_of_an_empty_hash() -> None:
    m = mirror()
    load(m, {})
    assert m.state == IdentityState(
        revision=0,
        cold_until=None,
        as_of=None,
        snapshot_id=None,
        polar=Aggregate(),
        local=Aggregate(),
        credits={},
        pending=0,
        undelivered=0,
        problems=(),
    )


def test_state_is_derived_from_the_fields() -> None:
    m = loaded(
        12,
        cu="1800000000",
        sa="1800000000123",
        sid="s-17",
        p="3 30 5 15",
        n="3",
        u="1",
        **{
            "a:1800000000": "2 7 3 4",
            "a:1800300000": "1 -1 -1 -1",
            "c:m-count": "100",
            "c:m-tokens": "2.5",
            "x": "ignored",
        },
    )
    state = m.state
    assert state.revision == 12
    assert (state.cold_until, state.as_of, state.snapshot_id) == (
        1_800_000_000,
        1_800_000_000_123,
        "s-17",
    )
    assert state.polar == Aggregate(count=3, sum=30.0, min=5.0, max=15.0)
    assert state.local == Aggregate(count=3, sum=6.0, min=-1.0, max=4.0)
    assert state.credits == {"m-count": 100.0, "m-tokens": 2.5}
    assert (state.pending, state.undelivered, state.problems) == (3, 1, ())


def test_state_is_cached_until_the_copy_changes() -> None:
    m = loaded(1, n="1")
    first = m.state
    assert m.state is first
    m.offer(delta(2, ("n", "2")))
    assert m.state is not first and m.state.pending == 2
    second = m.state
    m.offer(full(3, ("n", "3")))
    assert m.state.pending == 3 and m.state is not second
    third = m.state
    load(m, {"rev": "4", "n": "4"})
    assert m.state.pending == 4 and m.state is not third


def test_malformed_fields_are_reported_as_problems_and_left_out() -> None:
    m = loaded(
        3,
        cu="soon",
        sa="1.5",
        n="many",
        u="",
        p="1 2 3",
        **{
            "a:x": "1 1 1 1",
            "a:300": "garbage",
            "a:600": "1 5 5 5",
            "c:m1": "lots",
            "c:m2": "7",
        },
    )
    state = m.state
    assert sorted(state.problems) == sorted(
        [
            "a:x='1 1 1 1'",
            "a:300='garbage'",
            "c:m1='lots'",
            "p='1 2 3'",
            "cu='soon'",
            "sa='1.5'",
            "n='many'",
            "u=''",
        ]
    )
    assert state.local == Aggregate.of([5.0])
    assert state.credits == {"m2": 7.0}
    assert state.polar == Aggregate()
    assert (state.cold_until, state.as_of, state.pending, state.undelivered) == (None, None, 0, 0)


def test_negative_counters_read_as_absent() -> None:
    state = loaded(1, cu="-1", sa="-5", n="-2", u="-3").state
    assert (state.cold_until, state.as_of, state.pending, state.undelivered) == (None, None, 0, 0)
    # The scripts write no time before 1970 (a snapshot's are refused below 0), but a count
    # moved past 0 by their HINCRBY (an expired hash, say) is theirs: only the times are garbage.
    assert state.problems == ("cu='-1'", "sa='-5'")


@pytest.mark.parametrize("text", ["nan", "inf", "-Infinity"])
def test_non_finite_credits_are_a_problem(text: str) -> None:
    state = loaded(1, **{"c:m": text}).state
    assert state.credits == {}
    assert state.problems == (f"c:m={text!r}",)


def test_derive_state_reads_the_revision_from_the_hash_unless_given() -> None:
    fields = {"rev": "12", "n": "2"}
    assert derive_state(fields).revision == 12
    assert derive_state(fields, 3).revision == 3
    assert derive_state({}).revision == 0
    assert derive_state({"rev": "x"}).revision == 0
