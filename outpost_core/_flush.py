"""What one ``flush()`` waits for, and when it looks.

A flush is done when every entry the outboxes held as it began has left them: delivered or
dropped, then settled, by this instance or another. It learns that by reading the outboxes (the
last entry of each as it begins; later, whether anything up to that mark is left), which costs a
command per stream, so it does not look at every change: it looks when this instance's loops
hold nothing any more (they may just have settled the last of it), and at least every
:data:`LOOK` seconds for what other instances settle; never while a settle runs (half of a
batch would look settled).

Sans-IO: the driver reads the outboxes and tells :class:`FlushWatch` what it found.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

LOOK = 0.05
"""Seconds between two looks at the outboxes, at the most, while a flush waits."""


def last_entries(streams: Sequence[str], replies: Sequence[object]) -> dict[str, object]:
    """Each stream's last entry id from its ``XREVRANGE ... COUNT 1`` reply; a stream that is
    empty, or whose reply is not one (a peer's), has none."""
    marks: dict[str, object] = {}
    for stream, reply in zip(streams, replies, strict=True):
        if isinstance(reply, list) and reply and isinstance(reply[0], list | tuple) and reply[0]:
            entry_id = reply[0][0]
            if isinstance(entry_id, bytes | str):
                marks[stream] = entry_id
    return marks


class FlushWatch:
    def __init__(self, marks: Mapping[str, object], now: float, timeout: float) -> None:
        self.marks = dict(marks)
        """The streams that still hold an entry up to their mark, and that mark."""
        self._deadline = now + timeout
        self._looked = -math.inf

    def look_now(self, now: float, *, settling: bool, holding_nothing: bool) -> bool:
        """Whether to read the outboxes now (the look counts as taken)."""
        if settling or not (holding_nothing or now - self._looked >= LOOK):
            return False
        self._looked = now
        return True

    def looked(self, left: Mapping[str, bool]) -> bool:
        """What a look found: per stream of :attr:`marks`, whether any entry up to its mark is
        still there. Whether the flush is done."""
        for stream, remains in left.items():
            if not remains:
                self.marks.pop(stream, None)
        return self.done

    @property
    def done(self) -> bool:
        return not self.marks

    def wait(self, now: float) -> float | None:
        """Seconds to wait before asking :meth:`look_now` again (a settle of this instance may
        end the wait sooner); ``None`` once the flush has timed out."""
        remaining = self._deadline - now
        return None if remaining <= 0 else min(remaining, LOOK)
