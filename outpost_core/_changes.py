"""Parsing the changes our scripts reply with and publish.

A script answers (and publishes) ``{"c": [change, ...]}``; a change is
``{"k": state key, "r": revision, "s": [field, value, ...], "d": [field, ...], "full": 1?}``.
``full`` marks ``s`` as the whole state hash rather than a delta. Lua's cjson writes an empty list
as ``{}``, so an empty object is read as an empty list.

A reply that differs from what its script published, yet carries every change of it (whole
states), comes as a pair ``[message, reply]``: the published text first, so that its echo is
known without parsing it (``_echoes``); the reply's changes are the second.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import attrs

from ._peer import Unreadable, peer_json


@attrs.frozen(slots=True)
class Change:
    key: str
    rev: int
    set: tuple[tuple[str, str], ...] | None
    """``None`` when the script did not send content (the caller did not follow the identity)."""
    deleted: tuple[str, ...] = ()
    full: bool = False


class MalformedChange(ValueError):
    """A reply or message that is not what our scripts write."""


def parse_changes(raw: object, wanted: Callable[[str], bool] | None = None) -> list[Change] | None:
    """The changes of a reply or message; ``None`` for a duplicate-track reply.

    With ``wanted``, only the changes of the keys it accepts: the others are checked for a key
    and left unread (every instance hears every change of a shard, and follows few of them).
    """
    raw = reply_of(raw)
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedChange("not UTF-8") from exc
    if not isinstance(raw, str):
        raise MalformedChange(f"expected JSON text, got {type(raw).__name__}")
    if wanted is not None and _none_wanted(raw, wanted):
        return []
    try:
        obj = peer_json(raw)
    except Unreadable as exc:
        raise MalformedChange(str(exc)) from None
    if not isinstance(obj, dict):
        raise MalformedChange("not a JSON object")
    if obj.get("dup") == 1:
        return None
    items = _list(obj.get("c"), "c")
    if wanted is None:
        return [_change(item) for item in items]
    return [_change(item) for item in items if wanted(_key_of(item))]


def _none_wanted(text: str, wanted: Callable[[str], bool]) -> bool:
    """Whether every change of ``text`` is of a key ``wanted`` refuses, told without parsing it
    (an instance hears every change of its shards and follows few of their identities: parsing
    each cost ten times this look). Only when every key is plain text, without escapes: else the
    parse decides."""
    keys = _KEY.findall(text)
    return bool(keys) and len(keys) == len(_KEY_NAME.findall(text)) and not any(map(wanted, keys))


_KEY = re.compile(r'"k"\s*:\s*"([^"\\]*)"')
_KEY_NAME = re.compile(r'"k"\s*:')


def published_of(reply: object) -> object:
    """What the script published, as its reply says it: the first of a pair, else the reply
    itself (the same text when the caller held every previous revision)."""
    if isinstance(reply, list | tuple) and len(reply) == 2:
        return reply[0]
    return reply


def reply_of(reply: object) -> object:
    """The changes part of a reply: the second of a pair, else the reply itself."""
    if isinstance(reply, list | tuple) and len(reply) == 2:
        return reply[1]
    return reply


def _list(value: object, where: str) -> list[object]:
    if isinstance(value, dict) and not value:
        return []
    if not isinstance(value, list):
        raise MalformedChange(f"{where!r} is not a list")
    return value


def _strings(value: object, where: str) -> list[str]:
    items = _list(value, where)
    try:
        "".join(items)  # type: ignore[arg-type]  # a check in C: every reply is read here
    except TypeError:
        raise MalformedChange(f"{where!r} holds a non-string") from None
    return items  # type: ignore[return-value]


def _key_of(item: object) -> str:
    key = item.get("k") if isinstance(item, dict) else None
    if not isinstance(key, str):
        raise MalformedChange("a change needs a key")
    return key


def _change(item: object) -> Change:
    if not isinstance(item, dict):
        raise MalformedChange("a change is not an object")
    key, rev = item.get("k"), item.get("r")
    # type() is: JSON gives exact types, and a bool is not a revision
    if type(key) is not str or type(rev) is not int or rev < 0:
        raise MalformedChange("a change needs a key and a revision")
    raw_set = item.get("s", _ABSENT)
    if raw_set is _ABSENT:
        return Change(key, rev, None)
    flat = _strings(raw_set, "s")
    if len(flat) % 2:
        raise MalformedChange("'s' holds an odd number of items")
    pairs = tuple(zip(flat[::2], flat[1::2], strict=True))
    deleted = tuple(_strings(item.get("d", _NO_ITEMS), "d"))
    return Change(key, rev, pairs, deleted, item.get("full") == 1)


_ABSENT = object()
_NO_ITEMS: list[object] = []
