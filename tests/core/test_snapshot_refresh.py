"""Asking Polar again when no snapshot has counted what it was delivered: Polar pushes a snapshot
when its data moves, not when its ``cold_until`` passes a bucket it had already counted, so a
customer whose delivered events sit in buckets at or after the last snapshot's ``cold_until``
would otherwise keep them pending for as long as nothing else moves."""

from __future__ import annotations

import json
from typing import Any

import pytest

from outpost_core import ChangePublished, ScriptReplied, Settings, UsageError
from outpost_core._inputs import PendingListed
from outpost_core._session import _PortForRemote
from outpost_core._snapshots import Step
from tests.core.test_remote import (
    C1,
    SNAPSHOT_FIELDS,
    Polar,
    apply_reply,
    applying,
    listing,
    remote,
    state,
)

REFRESH = 5.0
"""Shorter than the default (ten minutes), so the link's pings need no answers meanwhile."""


def applied_leaving(polar: Polar, pending: int, undelivered: int, rev: int = 1) -> None:
    """Polar pushes c1's snapshot; Redis lists nothing to ask about and applies it, leaving
    ``pending`` events no snapshot counted, ``undelivered`` of them not yet delivered."""
    listed = listing(polar.snapshot(None))
    polar.session.handle(PendingListed(listed.tag, {}))
    run = applying(polar.effects())
    fields = dict(SNAPSHOT_FIELDS, n=str(pending), u=str(undelivered))
    polar.session.handle(ScriptReplied(apply_reply(rev, **fields), tag=run.tag))
    assert polar.effects() == []


def followed(settings: Settings | None = None) -> Polar:
    polar = Polar(settings or Settings(refresh_after=REFRESH)).connect()
    request_id = polar.follow()
    listed = listing(polar.snapshot(request_id))
    polar.session.handle(PendingListed(listed.tag, {}))
    run = applying(polar.effects())
    polar.session.handle(ScriptReplied(apply_reply(1, **SNAPSHOT_FIELDS), tag=run.tag))
    assert polar.take() == []
    return polar


def snapshot_requests(polar: Polar) -> list[Any]:
    return [m for m in polar.take() if m["type"] == "snapshot"]


def test_delivered_events_no_snapshot_counted_are_asked_about_once_the_wait_is_over() -> None:
    polar = followed()
    applied_leaving(polar, pending=5, undelivered=0, rev=2)
    applied_at = polar.now
    flow = remote(polar).flows[C1]
    assert flow.refresh_at == applied_at + REFRESH
    assert polar.session.next_deadline() is not None
    polar.tick(applied_at + REFRESH - 0.001)
    assert snapshot_requests(polar) == []
    polar.tick(applied_at + REFRESH)
    [request] = snapshot_requests(polar)
    assert request["payload"]["external_customer_id"] == "c1"
    # Asked again later if that answer never comes (or leaves them pending).
    assert flow.refresh_at == applied_at + 2 * REFRESH
    polar.tick(applied_at + 2 * REFRESH)
    assert len(snapshot_requests(polar)) == 1


def test_a_snapshot_that_counts_them_ends_the_asking() -> None:
    polar = followed()
    applied_leaving(polar, pending=5, undelivered=0, rev=2)
    polar.tick(polar.now + REFRESH)
    [request] = snapshot_requests(polar)
    listed = listing(polar.snapshot(request["payload"]["request_id"], snapshot_id="snap-2"))
    polar.session.handle(PendingListed(listed.tag, {}))
    run = applying(polar.effects())
    fields = dict(SNAPSHOT_FIELDS, sid="snap-2", n="0", u="0")
    polar.session.handle(ScriptReplied(apply_reply(3, **fields), tag=run.tag))
    flow = remote(polar).flows[C1]
    assert flow.refresh_at == polar.now + REFRESH  # it looks once more, and finds nothing
    polar.tick(polar.now + REFRESH)
    assert snapshot_requests(polar) == []
    assert flow.refresh_at is None
    assert polar.session.next_deadline() == remote(polar).link.next_deadline()


def test_events_still_on_their_way_to_polar_are_waited_for_not_asked_about() -> None:
    polar = followed()
    applied_leaving(polar, pending=5, undelivered=5, rev=2)
    flow = remote(polar).flows[C1]
    polar.tick(polar.now + REFRESH)
    assert snapshot_requests(polar) == []  # Polar has not got them: nothing to count yet
    assert flow.refresh_at == polar.now + REFRESH
    # They are delivered (the acknowledgement's change), and still no snapshot comes.
    change = {"c": [{"k": state("r-count"), "r": 3, "p": 2, "s": ["u", "0"], "d": {}}]}
    polar.session.handle(ChangePublished(json.dumps(change)))
    assert polar.effects() == []
    polar.tick(polar.now + REFRESH)
    assert len(snapshot_requests(polar)) == 1


def test_a_customer_with_nothing_pending_is_never_asked_about() -> None:
    polar = followed()
    flow = remote(polar).flows[C1]
    assert flow.refresh_at == polar.now + REFRESH
    polar.tick(polar.now + REFRESH)
    assert snapshot_requests(polar) == []
    assert flow.refresh_at is None


def test_a_dormant_customer_is_left_to_its_next_read() -> None:
    polar = followed()
    applied_leaving(polar, pending=5, undelivered=0, rev=2)
    flow = remote(polar).flows[C1]
    flow.dormant = True  # as after a reconnect, for a customer not read recently
    polar.tick(polar.now + REFRESH)
    assert snapshot_requests(polar) == []
    assert flow.refresh_at is None


def test_a_snapshot_in_progress_when_the_refresh_is_due_goes_on() -> None:
    polar = followed()
    applied_leaving(polar, pending=5, undelivered=0, rev=2)
    flow = remote(polar).flows[C1]
    due = polar.now + REFRESH
    polar.tick(due - 1.0)
    listing(polar.snapshot(None, snapshot_id="snap-3"))  # Polar pushed one: being applied
    polar.tick(due)
    assert snapshot_requests(polar) == []  # no need to ask: one is on its way
    assert flow.step is Step.BUCKETS


def test_off_when_set_to_none() -> None:
    polar = followed(Settings(refresh_after=None))
    applied_leaving(polar, pending=5, undelivered=0, rev=2)
    assert remote(polar).flows[C1].refresh_at is None


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan")])
def test_refresh_after_must_be_positive_and_finite(value: float) -> None:
    with pytest.raises(UsageError, match="refresh_after"):
        Settings(refresh_after=value)


def test_what_the_session_tells_polars_side() -> None:
    polar = Polar().connect()
    port = _PortForRemote(polar.session)
    assert polar.session.read("m-count", "c1") is None
    assert port.unsettled(C1) == (0, 0)  # followed, not loaded yet
    assert port.refresh_after == 600.0  # ten minutes: two buckets
