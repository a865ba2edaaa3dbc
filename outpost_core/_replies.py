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
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
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
        out += [(stream, entry_id, fields) for entry_id, fields in _entries(listing)]
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
    if not isinstance(reply, list | tuple) or len(reply) < 2:
        return []
    return [(stream, entry_id, fields) for entry_id, fields in _entries(reply[1])]


def _entries(listing: object) -> list[tuple[object, Mapping[Any, Any]]]:
    """A stream's (id, fields) pairs, fields as a mapping (RESP2 gives a flat list)."""
    if not isinstance(listing, list | tuple):
        return []
    out: list[tuple[object, Mapping[Any, Any]]] = []
    for item in listing:
        if not isinstance(item, list | tuple) or len(item) != 2:
            continue
        entry_id, fields = item
        if isinstance(fields, list | tuple):
            if len(fields) % 2:
                continue
            pairs = iter(fields)  # (name, value) pairs without slicing copies
            fields = dict(zip(pairs, pairs, strict=False))
        if isinstance(fields, Mapping):
            out.append((entry_id, fields))
    return out


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
