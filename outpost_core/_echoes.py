"""Recognising this instance's own changes when they come back over pub/sub.

A script publishes its change and replies with the very same text when the caller held the
previous revision of every identity; such a reply was applied in full, so its echo carries nothing
new and the subscriber skips it without parsing it or taking the core's lock. Bounded: an echo
that never comes (the subscription was down) is forgotten in time.
"""

from __future__ import annotations

import collections
import contextlib


class Echoes:
    def __init__(self, size: int = 4096) -> None:
        # OrderedDict: each operation used here is one atomic call, safe across threads.
        self._expected: collections.OrderedDict[bytes | str, None] = collections.OrderedDict()
        self._size = size

    def expect(self, reply: object) -> None:
        """A script of this instance replied: its echo may follow."""
        if isinstance(reply, bytes | str):
            self._expected[reply] = None
            if len(self._expected) > self._size:
                with contextlib.suppress(KeyError):  # another thread popped it first
                    self._expected.popitem(last=False)

    def seen(self, data: object) -> bool:
        """Whether ``data`` (a message from the channel) is an expected echo; forget it if so."""
        try:
            del self._expected[data]  # type: ignore[arg-type]
        except (KeyError, TypeError):
            return False
        return True

    def seen_in(self, response: object) -> bool:
        """Whether a raw pub/sub reply (``[b"smessage", channel, data]``, before a client library
        makes a message of it) is an expected echo; forget it if so."""
        return (
            isinstance(response, list)
            and len(response) == 3
            and response[0] in (b"smessage", "smessage")
            and self.seen(response[2])
        )

    def __len__(self) -> int:
        return len(self._expected)
