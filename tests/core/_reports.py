"""What a session reported for its driver to log, as a test looks at it."""

from __future__ import annotations

import logging

from outpost_core import Session


def said(session: Session, at: int = logging.DEBUG) -> list[tuple[int, str]]:
    """Drain the session's reports: (level, text) of those at ``at`` or above, in order."""
    return [(r.level, r.message) for r in session.reports() if r.level >= at]
