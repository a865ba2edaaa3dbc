"""Reading what a peer wrote (Redis, Polar, another instance) without letting it crash the reader.

``json.loads`` raises ``RecursionError`` on deeply nested text and ``int()`` refuses integers of
more than 4,300 digits: both are a peer's doing, so both become :class:`Unreadable` (a
``ValueError``), which every caller counts as a rejection.
"""

from __future__ import annotations

import json
from collections.abc import Callable

# The scanner json.loads runs (an attribute typeshed leaves out).
_scan: Callable[[str, int], tuple[object, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]

MAX_INT_DIGITS = 20
"""The longest integer our scripts and Polar write (any 64-bit integer fits)."""


class Unreadable(ValueError):
    """Peer text that does not parse, nests too deeply or holds an absurd number."""


def peer_json(text: str | bytes) -> object:
    """The JSON value of ``text``; :class:`Unreadable` whatever is wrong with it."""
    if type(text) is str:
        # The decoder's own scanner, straight: what json.loads runs for text that is one JSON
        # value from its first character to its last, without the layers around it (half its
        # cost for a script's reply). Anything else (space around it, garbage) takes the full
        # path below, which reads or refuses it as it always did.
        try:
            value, end = _scan(text, 0)
        except Exception:  # refused below, with json.loads' reason
            pass
        else:
            if end == len(text):
                return value
    try:
        return json.loads(text)
    except RecursionError:
        raise Unreadable("JSON nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError and integers past int()'s limit included
        raise Unreadable(f"not JSON ({_first_line(exc)})") from None


def decimal_int(text: str | None) -> int | None:
    """A decimal integer as our scripts write it (ASCII digits, an optional '-', at most
    :data:`MAX_INT_DIGITS` digits); ``None`` for anything else."""
    if text is None or not text.isascii():
        return None
    digits = text[1:] if text.startswith("-") else text
    if not digits.isdigit() or len(digits) > MAX_INT_DIGITS:
        return None
    return int(text)


def printable(text: str, limit: int | None = None) -> str:
    """``text`` safe for a terminal or a log line: control characters (escape sequences, newlines
    that would forge a line) written as ``\\xNN`` escapes, and at most ``limit`` characters."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + f"... ({len(text) - limit} more characters)"
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _first_line(exc: Exception) -> str:
    return str(exc).split("\n", 1)[0][:120]
