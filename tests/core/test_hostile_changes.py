"""Changes on a shard channel that are not what the scripts publish (any client of the Redis can
publish there): counted as rejections, never taken into a copy."""

from __future__ import annotations

import json
from typing import Any

from outpost_core import Balance, ChangePublished
from tests.core._payloads import COUNT
from tests.core.test_session import configured, state, warm

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
