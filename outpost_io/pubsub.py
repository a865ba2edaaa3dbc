"""The replies a subscription's connection has read already, straight from its hiredis reader.

Under load one read of the socket holds many published messages; redis-py hands them out one at
a time, each through several layers of calls. The subscriber takes them all at once here, raw
(``[b"smessage", channel, data]``), so that the echo of this instance's own change is recognised
before anything is made of it.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

try:  # what the reader answers when it holds no whole reply: False before redis-py 5.1
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH
except ImportError:  # pragma: no cover - older redis-py
    _NOT_ENOUGH = False


def buffered_replies(pubsub: Any) -> list[Any]:
    """The whole replies the subscription's hiredis reader holds (none without hiredis: its
    parser is not used then). An error that means the connection is broken is raised, as
    redis-py would."""
    reader = getattr(getattr(pubsub.connection, "_parser", None), "_reader", None)
    if reader is None or not hasattr(reader, "gets"):
        return []
    replies: list[Any] = []
    while True:
        reply = reader.gets()
        if no_whole_reply(reply):
            return replies
        if isinstance(reply, RedisConnectionError):
            raise reply
        replies.append(reply)


def no_whole_reply(reply: object) -> bool:
    """Whether a hiredis reader's ``gets()`` answered that it holds no whole reply yet."""
    return reply is _NOT_ENOUGH or reply is False
