"""Count, sum, min and max of a set of events, as Polar keeps them in its bucket rows.

Every reducer keeps all four whatever its aggregation; the aggregation only picks the consumed
quantity at read time (avg is sum / count). The Redis form is four space-separated numbers, min and
max written ``-`` when the set is empty; the Lua scripts read and write the same form.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import attrs

from ._peer import MAX_INT_DIGITS

_EXACT_INT = 2**53


_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?", re.ASCII)


def format_number(value: float) -> str:
    """Exactly as the scripts' ``fmt`` writes it: integral values below 2**53 without a point,
    others in the shortest of ``%.15g``, ``%.16g``, ``%.17g`` that reads back exactly."""
    value = float(value)
    if value.is_integer() and abs(value) < _EXACT_INT:
        return str(int(value))
    for digits in (15, 16):
        text = format(value, f".{digits}g")
        if float(text) == value:
            return text
    return format(value, ".17g")


def parse_number(text: str) -> float | None:
    """A number as the scripts write it (``tonumber`` reads it the same); ``None`` otherwise."""
    if not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


@attrs.frozen(slots=True)
class Aggregate:
    count: int = 0
    sum: float = 0.0
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Iterable[float]) -> Aggregate:
        total = EMPTY
        for value in values:
            total = total.add(value)
        return total

    def add(self, value: float) -> Aggregate:
        return Aggregate(
            count=self.count + 1,
            sum=self.sum + value,
            min=value if self.min is None else min(self.min, value),
            max=value if self.max is None else max(self.max, value),
        )

    def merge(self, other: Aggregate) -> Aggregate:
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        assert self.min is not None and self.max is not None
        assert other.min is not None and other.max is not None
        return Aggregate(
            count=self.count + other.count,
            sum=self.sum + other.sum,
            min=min(self.min, other.min),
            max=max(self.max, other.max),
        )

    def quantity(self, func: str) -> float:
        """The consumed units under aggregation ``func``, as Polar's usage read returns them."""
        if func == "count":
            return float(self.count)
        if func == "sum":
            return self.sum
        if func == "avg":
            return self.sum / self.count if self.count else 0.0
        if func == "min":
            return self.min if self.min is not None else 0.0
        if func == "max":
            return self.max if self.max is not None else 0.0
        raise ValueError(f"aggregation {func!r} has no bucketed quantity")

    def encode(self) -> str:
        lo = "-" if self.min is None else format_number(self.min)
        hi = "-" if self.max is None else format_number(self.max)
        return f"{self.count} {format_number(self.sum)} {lo} {hi}"

    @classmethod
    def decode(cls, text: str) -> Aggregate | None:
        """Parse the Redis form; ``None`` when the text is not one (a peer wrote garbage)."""
        numbers = _decoded(text)
        if numbers is None:
            return None
        count, total, lo, hi = numbers
        return EMPTY if count == 0 else cls(count=count, sum=total, min=lo, max=hi)

    @classmethod
    def from_wire(cls, obj: object) -> Aggregate | None:
        """Parse Polar's JSON ``{"count", "sum", "min", "max"}``; ``None`` when malformed."""
        if not isinstance(obj, dict):
            return None
        count, total, lo, hi = obj.get("count"), obj.get("sum"), obj.get("min"), obj.get("max")
        if not is_count(count) or not is_number(total):
            return None
        assert isinstance(count, int) and isinstance(total, int | float)
        if count == 0:
            return EMPTY if lo is None and hi is None and total == 0 else None
        if not is_number(lo) or not is_number(hi):
            return None
        assert isinstance(lo, int | float) and isinstance(hi, int | float)
        if lo > hi:
            return None
        return cls(count=count, sum=float(total), min=float(lo), max=float(hi))


EMPTY = Aggregate()


def readable(text: str) -> bool:
    """Whether :meth:`Aggregate.decode` reads ``text`` (without building the aggregate)."""
    return _decoded(text) is not None


def _decoded(text: str) -> tuple[int, float, float | None, float | None] | None:
    """The Redis form's four numbers (the min and max of none: ``None``), or ``None``."""
    match = _AGGREGATE.fullmatch(text)  # one pass over the text: every read and change has some
    if match is None:
        return None
    count_text, total_text, lo_text, hi_text = match.groups()
    count, total = int(count_text), float(total_text)
    if count < 0 or not math.isfinite(total):
        return None
    if count == 0:
        return (0, 0.0, None, None) if lo_text == hi_text == "-" and total == 0 else None
    if lo_text == "-" or hi_text == "-":
        return None
    lo, hi = float(lo_text), float(hi_text)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        return None
    return count, total, lo, hi


_NUMBER_TEXT = r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
_AGGREGATE = re.compile(
    rf"(-?[0-9]{{1,{MAX_INT_DIGITS}}}) ({_NUMBER_TEXT}) ({_NUMBER_TEXT}|-) ({_NUMBER_TEXT}|-)",
    re.ASCII,
)
"""``count sum min max`` as the scripts write them: the count a decimal integer, the others
numbers as :func:`parse_number` reads them, the min and max ``-`` for none."""


def is_count(value: object) -> bool:
    """A JSON integer from 0 to 2**53 - 1 (not a bool): past it, a JavaScript peer reads another
    number, and Polar writes none (the TypeScript SDK refuses the same)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _EXACT_INT


def is_number(value: object) -> bool:
    """A finite int or float (not a bool) that converts to a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float (peer input: refuse, not raise)
        return False
