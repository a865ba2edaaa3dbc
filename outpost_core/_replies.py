"""Redis's replies as a client library hands them over, read into plain Python.

A reply may come as bytes or text (a client that decodes responses, or not) and in RESP2 or RESP3
shapes (lists, or dicts where RESP3 has maps). Its contents are Redis's, which anyone sharing the
Redis may have written: nothing here raises on them; what cannot be read is left out, and whoever
reads the result counts it (the delivery loop counts unreadable entries).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

StreamEntry = tuple[object, object, Mapping[Any, Any]]
"""(stream, entry id, fields), each as Redis answered (bytes or text)."""


def text_of(value: object) -> str | None:
    """A reply item as text: ``None`` unless it is text or UTF-8 bytes."""
    if type(value) is bytes:  # what replies hold: looked at first
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return text_of(bytes(value))  # a subclass of bytes
    return None


def stream_entries(reply: object) -> list[StreamEntry]:
    """``XREADGROUP``'s answer as (stream, id, fields) entries: RESP2 ``[[stream, entries]...]``
    or RESP3 ``{stream: entries}``, where RESP3 may wrap each stream's entries once more. Entries
    deleted since they were delivered (fields ``None``) are left out: nothing is left to send."""
    if isinstance(reply, Mapping):
        streams: list[Any] = list(reply.items())
    elif isinstance(reply, list | tuple):
        streams = list(reply)
    else:
        return []
    out: list[StreamEntry] = []
    for pair in streams:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            continue
        stream, listing = pair
        if _wrapped(listing):
            listing = listing[0]  # RESP3 wraps each stream's entries once more
        _add_entries(out, stream, listing)
    return out


def _wrapped(listing: object) -> bool:
    """Whether a stream's listing is one list of entries (RESP3), not the entries themselves:
    an entry's first item is its id, never a list."""
    if not isinstance(listing, list) or len(listing) != 1 or not isinstance(listing[0], list):
        return False
    inner = listing[0]
    return not inner or isinstance(inner[0], list | tuple)


def claimed_entries(stream: str, reply: object) -> list[StreamEntry]:
    """``XAUTOCLAIM``'s answer (next cursor, claimed entries, deleted ids) as entries of
    ``stream``; deleted entries are left out."""
    out: list[StreamEntry] = []
    if isinstance(reply, list | tuple) and len(reply) >= 2:
        _add_entries(out, stream, reply[1])
    return out


def _add_entries(out: list[StreamEntry], stream: object, listing: object) -> None:
    """A stream's entries added to ``out``, fields as a mapping (RESP2 gives a flat list). One
    pass, tuples for isinstance, dicts told by their type first: a read of a thousand entries
    spent more here than in the core's own look at each."""
    if not isinstance(listing, _SEQUENCES):
        return
    append = out.append
    for item in listing:
        if not isinstance(item, _SEQUENCES) or len(item) != 2:
            continue
        entry_id, fields = item
        if isinstance(fields, _SEQUENCES):
            if len(fields) % 2:
                continue
            pairs = iter(fields)  # (name, value) pairs without slicing copies
            append((stream, entry_id, dict(zip(pairs, pairs, strict=False))))
        elif type(fields) is dict or isinstance(fields, Mapping):
            append((stream, entry_id, fields))


_SEQUENCES = (list, tuple)


def published_data(response: object) -> object | None:
    """The data of a raw pub/sub reply that is a published message (``[b"smessage", channel,
    data]``, before a client library makes a message of it); ``None`` for any other reply."""
    if (
        isinstance(response, list)
        and len(response) == 3
        and response[0] in (b"smessage", "smessage")
    ):
        data: object = response[2]
        return data
    return None


def lost_its_data(error: str) -> bool:
    """Whether a Redis error says the outbox group is gone: Redis restarted without its data, or
    someone flushed it (a read says NOGROUP, a survey ``no such key``). The groups are created
    again at once, rather than waited on as an outage."""
    return "NOGROUP" in error or "no such key" in error
