"""The session never logs: it queues the lines its driver should log, as :class:`Report`, and
:meth:`Session.reports` drains them. A session nobody drains keeps only the newest lines."""

from __future__ import annotations

import logging

from outpost_core import ChannelsLost, IdentityLoaded, Report, Settings, Tick
from outpost_core._reports import KEPT, Reports, error_text
from tests.core._payloads import COUNT
from tests.core._reports import said
from tests.core.test_session import C1, configured, load_asked, snapshot_fields, state, warm

WALL = 1_700_000_000_000_000


def test_a_read_reports_its_load_and_the_load_its_revision_at_debug() -> None:
    session = configured()
    said(session)
    assert session.read(COUNT, "c1") is None
    key = state("r-count")
    assert said(session) == [(logging.DEBUG, f"outpost loads {key} (copy at revision -1)")]
    session.handle(IdentityLoaded(key, snapshot_fields(rev=4), load_asked(session, key)))
    assert said(session) == [(logging.DEBUG, f"outpost loaded {key} at revision 4")]
    assert session.reports() == []  # drained


def test_a_customer_let_go_is_reported_at_debug() -> None:
    session = configured(settings=Settings(idle_customer_ttl=10.0))
    warm(session)
    session.handle(Tick(1.0, WALL))  # the read dates from here
    said(session)
    session.handle(Tick(100.0, WALL))
    assert said(session) == [(logging.DEBUG, f"outpost lets go of {C1}")]


def test_a_session_nobody_drains_keeps_the_newest_lines_and_counts_the_others() -> None:
    session = configured()
    said(session)
    channels = tuple(f"not-ours-{n}" for n in range(KEPT + 5))
    session.handle(ChannelsLost(channels))
    assert session.rejections["subscription"] == KEPT + 5
    first, *kept = session.reports()
    text = "outpost let go of 5 older log lines no one collected in time"
    assert first == Report(logging.WARNING, text)
    assert len(kept) == KEPT
    assert kept[0].message.endswith("'not-ours-5'") and kept[-1].message.endswith(
        f"'not-ours-{KEPT + 4}'"
    )
    assert session.reports() == []  # the count starts again


def test_lines_let_go_are_said_at_the_level_of_the_most_severe_of_them() -> None:
    reports = Reports(kept=2)
    for level in (logging.DEBUG, logging.DEBUG, logging.INFO):
        reports.add(level, "line")
    assert reports.drain()[0] == Report(
        logging.DEBUG, "outpost let go of 1 older log lines no one collected in time"
    )
    reports.relay(None)  # nothing to say
    for level in (logging.ERROR, logging.DEBUG, logging.DEBUG, logging.DEBUG):
        reports.relay(Report(level, "line"))
    assert [r.level for r in reports.drain()] == [logging.ERROR, logging.DEBUG, logging.DEBUG]
    assert reports.drain() == []


def test_an_error_not_raised_is_its_type_and_message_only() -> None:
    assert error_text(ValueError("bad\nline")) == "ValueError: bad\\nline"
