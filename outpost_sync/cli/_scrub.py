"""The commands' last guard on what they print: no secret they were given, no raw control
character (an event id or a Redis field holding escape sequences reaches the operator's
terminal as text, not as commands to it)."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from outpost_core import scrub

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: str, secrets: Sequence[str]) -> str:
    """``text`` without ``secrets`` and with control characters (but newlines and tabs)
    escaped."""
    return _CONTROL.sub(lambda m: ascii(m.group(0))[1:-1], scrub(text, secrets))


class _Scrubbing:
    def __init__(self, stream: TextIO, secrets: Sequence[str]) -> None:
        self._stream = stream
        self._secrets = secrets

    def write(self, text: str) -> int:
        self._stream.write(clean(text, self._secrets))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def scrubbed_output(secrets: Sequence[str]) -> Iterator[None]:
    """Standard output and error, cleaned, for the duration."""
    out, err = sys.stdout, sys.stderr
    sys.stdout = _Scrubbing(out, secrets)
    sys.stderr = _Scrubbing(err, secrets)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
