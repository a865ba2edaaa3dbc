"""Recognising this instance's own changes when they come back over pub/sub.

A script publishes its change and replies with the very same text when the caller held the
previous revision of every identity, or with that text beside its own when it answers with whole
states (``_changes``); either reply carries all its echo does, so the subscriber skips the echo
without parsing it or taking the core's lock. Bounded: an echo that never comes (the subscription
was down) is forgotten in time.

An echo may also come before its reply. While scripts of this instance are in flight, a message
nobody expects is held, with the scripts that were in flight when it came: only one of those can
have published it. Each reply takes its own echo out of what is held; a held message goes to the
core once every script it could belong to has replied (then it is some other instance's change).
So with many scripts in flight at once, each echo is still dropped unparsed by its own reply,
rather than applied early by whichever reply came first.

The session owns one (``Session.script_sent``, ``Session.own_echo``, and its ``ScriptReplied``,
``ScriptFailed`` and ``ChangePublished`` inputs); a driver never drives it by hand.
"""

from __future__ import annotations

import collections
import contextlib

from ._changes import published_of
from .errors import UsageError

_TEXTS = (bytes, str)  # a tuple of types: isinstance() reads it faster than a union


class Echoes:
    def __init__(self, size: int = 4096) -> None:
        # OrderedDict: each operation used here is one atomic call, safe across threads.
        self._expected: collections.OrderedDict[bytes | str, None] = collections.OrderedDict()
        self._size = size
        self._next_ticket = 0
        # The scripts in flight, by ticket; a dict keeps them in the order they were sent, so
        # the first is the oldest.
        self._in_flight: dict[int, None] = {}
        # (tickets below this one could have published it, the message), in the order they came.
        self._held: collections.deque[tuple[int, object]] = collections.deque()

    def sent(self) -> int:
        """A script of this instance is on its way: a message may be its echo, come early. The
        ticket goes back with its reply to :meth:`replied`."""
        ticket = self._next_ticket
        self._next_ticket += 1
        self._in_flight[ticket] = None
        return ticket

    @property
    def holding(self) -> bool:
        """Whether a message nobody expects would be held now (scripts are in flight)."""
        return bool(self._in_flight)

    def hold(self, data: object) -> bool:
        """The subscriber got ``data``, which it did not expect: whether it is held (a script is
        in flight, and this may be its echo) rather than to be applied now."""
        if not self._in_flight:
            return False
        self._held.append((self._next_ticket, data))
        return True

    def replied(self, ticket: int, reply: object) -> list[object]:
        """The script of ``ticket`` replied (``None``: it failed). Returns the held messages to
        apply now, before the reply, in the order they came: those no script still in flight
        can have published. The reply's own echo is dropped; when it has not come yet, it is
        expected."""
        try:
            del self._in_flight[ticket]
        except KeyError:
            raise UsageError(f"ticket {ticket} is not a script in flight") from None
        held = self._held
        if reply is not None:
            echo = published_of(reply)
            if not (held and self._take_held(echo)):
                self._expect(echo)
        if not held:  # the usual case: nothing came while scripts were in flight
            return []
        oldest = next(iter(self._in_flight), self._next_ticket)
        released = []
        while held and held[0][0] <= oldest:
            released.append(held.popleft()[1])
        return released

    def _take_held(self, reply: object) -> bool:
        for index, (_, data) in enumerate(self._held):
            if data == reply:
                del self._held[index]
                return True
        return False

    def expect(self, reply: object) -> None:
        """A script of this instance replied: its echo may follow (the reply itself, or the
        published text a pair carries)."""
        self._expect(published_of(reply))

    def _expect(self, echo: object) -> None:
        if isinstance(echo, _TEXTS):
            expected = self._expected
            expected[echo] = None
            if len(expected) > self._size:
                with contextlib.suppress(KeyError):  # another thread popped it first
                    expected.popitem(last=False)

    def seen(self, data: object) -> bool:
        """Whether ``data`` (a message from the channel) is an expected echo; forget it if so."""
        try:
            del self._expected[data]  # type: ignore[arg-type]
        except (KeyError, TypeError):
            return False
        return True

    def __len__(self) -> int:
        return len(self._expected)
