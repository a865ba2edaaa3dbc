"""Parsing the changes our scripts reply with and publish.

A script answers (and publishes) ``{"c": [change, ...]}``; a change is
``{"k": state key, "r": revision, "s": [field, value, ...], "d": [field, ...], "full": 1?}``.
``full`` (1, the only value the scripts write) marks ``s`` as the whole state hash rather than a
delta. Lua's cjson writes an empty list
as ``{}``, so an empty object is read as an empty list.

A reply that differs from what its script published, yet carries every change of it (whole
states), comes as a pair ``[message, reply]``: the published text first, so that its echo is
known without parsing it (``_echoes``); the reply's changes are the second.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from ._peer import Unreadable, decimal_int, peer_json


class Change(NamedTuple):
    # A named tuple, not an attrs class: every reply and followed message makes one, and a
    # tuple's constructor costs half of a frozen attrs class's.
    key: str
    rev: int
    set: tuple[tuple[str, str], ...] | None
    """``None`` when the script did not send content (the caller did not follow the identity)."""
    deleted: tuple[str, ...] = ()
    full: bool = False


MAX_REVISION = 2**53 - 1
"""The highest revision the scripts write: past it, neither a Lua number nor a JavaScript one
counts by one. A revision above it, or below 0, is a peer's garbage."""


def revision_of(text: str | None) -> int | None:
    """A state hash's ``rev`` as the scripts write it; ``None`` for anything else."""
    rev = decimal_int(text)
    return rev if rev is not None and 0 <= rev <= MAX_REVISION else None


class MalformedChange(ValueError):
    """A reply or message that is not what our scripts write."""


def parse_changes(raw: object, wanted: Callable[[str], bool] | None = None) -> list[Change] | None:
    """The changes of a reply or message; ``None`` for a duplicate-track reply.

    With ``wanted``, only the changes of the keys it accepts: the others are checked for a key
    and left unread (every instance hears every change of a shard, and follows few of them).
    """
    if type(raw) is not bytes:  # (bytes: a reply or message as Redis sent it, not a pair)
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
    items = obj.get("c")
    if type(items) is not list:
        items = _not_list(items, "c")
    # A loop rather than comprehensions: most texts hold one change, and a comprehension's own
    # frame costs more than its loop saves.
    changes = []
    for item in items:
        if wanted is None or wanted(_key_of(item)):
            changes.append(_change(item))
    return changes


def _none_wanted(text: str, wanted: Callable[[str], bool]) -> bool:
    """Whether every change of ``text`` is of a key ``wanted`` refuses, told without parsing it
    (an instance hears every change of its shards and follows few of their identities: parsing
    each cost ten times this look). Only when every key is plain text, without escapes: else the
    parse decides."""
    at = text.find('"k":"')
    if at >= 0 and text.count('"k"') == 1:
        # One change, its key written as our scripts write it (the usual text, and a reply to
        # this instance's track among them): read by searches of the text, cheaper than the
        # expressions below, which would find this one key.
        end = text.find('"', at + 5)
        key = text[at + 5 : end]
        if end >= 0 and "\\" not in key:
            return not wanted(key)
    keys = _KEY.findall(text)
    if not keys or any(map(wanted, keys)):
        return False  # (a reply to this instance's track: its key is wanted, told by one search)
    return len(keys) == len(_KEY_NAME.findall(text))


_KEY = re.compile(r'"k"\s*:\s*"([^"\\]*)"')
_KEY_NAME = re.compile(r'"k"\s*:')


def published_of(reply: object) -> object:
    """What the script published, as its reply says it: the first of a pair, else the reply
    itself (the same text when the caller held every previous revision)."""
    if isinstance(reply, _PAIRS) and len(reply) == 2:
        return reply[0]
    return reply


def reply_of(reply: object) -> object:
    """The changes part of a reply: the second of a pair, else the reply itself."""
    if isinstance(reply, _PAIRS) and len(reply) == 2:
        return reply[1]
    return reply


_PAIRS = (list, tuple)  # a tuple of types: isinstance() reads it faster than a union


def _not_list(value: object, where: str) -> list[object]:
    """What is not a list where a list goes (JSON gives exact types, so callers tell a list by
    ``type() is``): the empty object is the empty list, as cjson writes it; else malformed."""
    if isinstance(value, dict) and not value:
        return []
    raise MalformedChange(f"{where!r} is not a list")


def _strings(value: object, where: str) -> list[str]:
    items = value if type(value) is list else _not_list(value, where)
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
    if type(key) is not str or type(rev) is not int or not 0 <= rev <= MAX_REVISION:
        raise MalformedChange("a change needs a key and a revision")
    raw_set = item.get("s", _ABSENT)
    if raw_set is _ABSENT:
        return Change(key, rev, None)
    flat: list[str] = raw_set if type(raw_set) is list else _not_list(raw_set, "s")  # type: ignore[assignment]
    try:
        "".join(flat)  # as _strings() checks, inlined: every reply is read here
    except TypeError:
        raise MalformedChange("'s' holds a non-string") from None
    if len(flat) % 2:
        raise MalformedChange("'s' holds an odd number of items")
    each = iter(flat)  # zipped with itself: (field, value) pairs
    raw_deleted = item.get("d", _NO_ITEMS)
    if type(raw_deleted) in _EMPTY_TYPES and not raw_deleted:  # cjson writes [] as {}
        deleted: tuple[str, ...] = ()
    else:
        deleted = tuple(_strings(raw_deleted, "d"))
    full = item.get("full", _ABSENT)
    # The scripts write 1 or nothing; JSON's true is no 1 (TypeScript's === tells them apart).
    if full is not _ABSENT and (full != 1 or type(full) is bool):
        raise MalformedChange("'full' is not 1")
    pairs = tuple(zip(each, each, strict=True))
    return _new(Change, (key, rev, pairs, deleted, full is not _ABSENT))


_ABSENT = object()
_new = tuple.__new__  # Change(...) without its own __new__'s frame: every change read makes one
_NO_ITEMS: list[object] = []
_EMPTY_TYPES = (dict, list)
