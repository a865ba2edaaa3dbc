"""Changes on a shard channel that are not what the scripts publish (any client of the Redis can
publish there): counted as rejections, never taken into a copy."""

from __future__ import annotations

import json
from typing import Any

import pytest

from outpost_core import Balance, ChangePublished, IdentityLoaded
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
