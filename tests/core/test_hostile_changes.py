"""Changes on a shard channel that are not what the scripts publish (any client of the Redis can
publish there): counted as rejections, never taken into a copy."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outpost_core import Balance, ChangePublished, IdentityLoaded
from outpost_core._aggregate import Aggregate
from outpost_core._mirror import derive_state, unreadable_fields
from tests.core._payloads import COUNT
from tests.core.test_session import configured, load_asked, snapshot_fields, state, warm

KEY = state("r-count")


def _published(**change: Any) -> ChangePublished:
    return ChangePublished(json.dumps({"c": [{"k": KEY, **change}]}))


def test_a_change_whose_full_is_true_is_counted_and_not_taken() -> None:
    session = configured()
    before = warm(session)  # revision 3
    session.handle(_published(r=4, s=["rev", "4", "p", "0 0 - -"], full=True))
    assert session.rejections == {"change": 1}
    assert session.read(COUNT, "c1") == before


def test_a_change_whose_deleted_fields_are_null_is_counted_and_not_taken() -> None:
    session = configured()
    before = warm(session)
    session.handle(_published(r=4, s=["p", "0 0 - -"], d=None))
    assert session.rejections == {"change": 1}
    after = session.read(COUNT, "c1")
    assert isinstance(after, Balance) and after == before


# Values the scripts never write, each in a field a read uses (the copy holds 10 credited, 2
# consumed: a balance of 8).
UNREADABLE = [
    ("a:123", "x y z"),
    ("c:m-count", "NaN"),
    ("p", "1 2"),
    ("cu", "-1"),
    ("h:x", "garbage"),
    ("rev", "-4"),
]


@pytest.mark.parametrize(("name", "value"), UNREADABLE)
def test_a_change_holding_an_unreadable_value_is_counted_and_the_hash_decides(
    name: str, value: str
) -> None:
    session = configured()
    before = warm(session)
    session.handle(_published(r=4, s=[name, value, "n", "0"]))
    assert session.rejections == {"change": 1}
    # Not taken: the copy reloads the hash (here, as it was: a peer published the change).
    load_id = load_asked(session, KEY)
    assert session.read(COUNT, "c1") is None
    assert session.effects() == []
    session.handle(IdentityLoaded(KEY, snapshot_fields(), load_id))
    assert session.read(COUNT, "c1") == before
    assert session.rejections == {"change": 1}


def test_an_unreadable_polar_aggregate_never_lifts_the_balance_above_the_hash() -> None:
    session = configured()
    assert warm(session).balance == 8
    session.handle(_published(r=4, s=["p", "1 2"]))
    # Taken, "p" read as absent, the copy forgot Polar's 2 consumed units: a balance of 10.
    assert session.read(COUNT, "c1") is None  # the copy reloads instead
    session.handle(IdentityLoaded(KEY, snapshot_fields(rev=4), load_asked(session, KEY)))
    after = session.read(COUNT, "c1")
    assert isinstance(after, Balance) and after.balance == 8 and after.revision == 4


def test_an_old_change_holding_an_unreadable_value_is_counted_and_reloads_nothing() -> None:
    session = configured()
    before = warm(session)  # revision 3
    session.handle(_published(r=3, s=["p", "1 2"]))
    assert session.rejections == {"change": 1}
    assert session.effects() == []
    assert session.read(COUNT, "c1") == before


_NAMES = st.sampled_from(
    ["a:1", "a:x", "a:-5", "h:h1", "c:m", "p", "rev", "cu", "sa", "n", "u", "sid"]
)
_TEXTS = st.sampled_from(
    [
        *("1 1 1 1", "0 0 - -", "0 1 - -", "2 3 5 4", "-0 0 - -", "1 1e400 1 1", "x", "3", "-1"),
        *("1.5", "2 3", "NaN", "99999999999999999999", "", "5 1765000000000000", "0x10"),
        "253402300800000000",
    ]
)


@given(st.lists(st.tuples(_NAMES, _TEXTS), max_size=6))
def test_a_change_is_checked_field_by_field_as_a_load_would_find_it(
    pairs: list[tuple[str, str]],
) -> None:
    """The check every change passes before a copy takes it names what a read of the same
    fields would refuse, in the same order (the rejection's words)."""
    assert unreadable_fields(pairs) == derive_state(dict(pairs), 0).problems


def test_aggregates_are_read_as_the_scripts_write_them() -> None:
    for text in ("1 1 1 1", "0 0 - -", "-0 0 - -", "2 -1.5e2 -3 1e3"):
        assert Aggregate.decode(text) is not None, text
    for text in ("-1 0 - -", "1 1e400 1 1", "0 1 - -", "0 0 1 1", "1 1 - 1", "1 1 1 -", "2 3 5 4"):
        assert Aggregate.decode(text) is None, text
    for text in ("1 1 1e400 1e400", "1 1 -1e400 1", "1  1 1 1", "1 1 1 1 ", "٣ 1 1 1", "1 1 1"):
        assert Aggregate.decode(text) is None, text
