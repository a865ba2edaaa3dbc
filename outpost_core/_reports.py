"""The log lines a machine of the core holds for its driver: the core never logs, it reports.

A driver drains :meth:`Reports.drain` after each input it hands over and logs each line. A
machine nobody drains must not grow for ever: :class:`Reports` keeps the newest lines only,
counts the ones it lets go, and says so first in the next drain.
"""

from __future__ import annotations

import collections
import logging

from ._outage import Report
from ._peer import printable

KEPT = 1000
"""The most lines held between two drains (letting go of 16,000 idle customers at once is one
debug line each: the oldest go, counted)."""


class Reports:
    __slots__ = ("_dropped", "_dropped_level", "_kept", "_lines")

    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._lines: collections.deque[Report] = collections.deque()
        self._dropped = 0
        self._dropped_level = logging.NOTSET

    def add(self, level: int, message: str) -> None:
        self.relay(Report(level, message))

    def relay(self, report: Report | None) -> None:
        """Hold a line another part of the core made (``None``: nothing to say)."""
        if report is None:
            return
        lines = self._lines
        if len(lines) >= self._kept:
            oldest = lines.popleft()
            self._dropped += 1
            self._dropped_level = max(self._dropped_level, oldest.level)
        lines.append(report)

    def drain(self) -> list[Report]:
        """The lines held, oldest first; first, when some were let go, how many (at the level of
        the most severe of them: dropped debug lines are no warning)."""
        lines = self._lines
        if not lines:  # (a drop leaves the queue full: nothing held, nothing dropped)
            return []
        out = list(lines)
        lines.clear()
        if self._dropped:
            text = f"outpost let go of {self._dropped} older log lines no one collected in time"
            out.insert(0, Report(self._dropped_level, text))
            self._dropped, self._dropped_level = 0, logging.NOTSET
        return out


def error_text(exc: BaseException) -> str:
    """An error of ours, for a log line: its type, its message (a peer's text may be in it: one
    printable excerpt), and where it was raised (file, line and function of each frame, innermost
    last; not the source lines, which are files to read)."""
    text = printable(f"{type(exc).__name__}: {exc}", 300)
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        text += f"\n  at {code.co_filename}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    return text
