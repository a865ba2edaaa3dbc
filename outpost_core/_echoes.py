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
        self._in_flight = 0
        self._held: list[object] = []

    def sent(self) -> None:
        """A script of this instance is on its way: a message may be its echo, come early."""
        self._in_flight += 1

    def hold(self, data: object) -> bool:
        """The subscriber got ``data``, which it did not expect: whether it is held (a script is
        in flight, and this may be its echo) rather than to be applied now."""
        if self._in_flight <= 0:
            return False
        self._held.append(data)
        return True

    def replied(self, reply: object) -> list[object]:
        """A script :meth:`sent` replied (``None``: it failed). The held messages to apply now,
        before the reply, in the order they came: all of them but the reply's own echo. When
        that echo has not come yet, it is expected."""
        self._in_flight -= 1
        held, self._held = self._held, []
        if reply is None:
            return held
        for index, data in enumerate(held):
            if data == reply:
                del held[index]
                return held
        self.expect(reply)
        return held

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

    def __len__(self) -> int:
        return len(self._expected)
