"""The checks of numeric settings, made at construction: NaN passes every comparison, and a
fraction or an infinity would reach Redis or Polar from a loop as a command or a header they
refuse, again and again. Each names the caller's option in its message."""

from __future__ import annotations

import math
from typing import TypeGuard

from .errors import UsageError


def finite(value: object) -> TypeGuard[int | float]:
    """A real number (not a bool), neither NaN nor infinite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def require_whole(name: str, value: object, least: int, what: str) -> None:
    """``value`` an integer (not a bool) of at least ``least`` (``what`` says it)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{name} must be an integer, {what}, got {value!r}")


def require_positive(name: str, value: object) -> None:
    """``value`` a finite number above 0."""
    if not finite(value) or value <= 0:
        raise UsageError(f"{name} must be a positive, finite number, got {value!r}")
