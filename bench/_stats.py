"""Figures: what one benchmark measured, against its baseline, with its ratio and target."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def ns_to_us(samples: Sequence[float]) -> list[float]:
    return [s / 1000.0 for s in samples]


@dataclass
class Side:
    """The samples of one side of a figure (the subject, or its baseline), in the figure's unit.

    For a rate (higher is better) the tail that matters is the slow one, so ``p99`` is then the
    value that 99 % of the samples beat (the 1st percentile).
    """

    label: str
    samples: list[float]
    higher_is_better: bool = False

    @property
    def p50(self) -> float:
        return percentile(self.samples, 50)

    @property
    def p99(self) -> float:
        return percentile(self.samples, 1 if self.higher_is_better else 99)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "p50": self.p50,
            "p99": self.p99,
            "mean": statistics.fmean(self.samples) if self.samples else math.nan,
            "min": min(self.samples) if self.samples else math.nan,
            "max": max(self.samples) if self.samples else math.nan,
            "n": len(self.samples),
        }


@dataclass(frozen=True)
class Target:
    """A target on the figure's ``ratio``, on the subject's ``p99`` or ``p50``, or on ``delta``
    (the subject's p50 minus the baseline's: what the subject adds, in the figure's unit)."""

    on: Literal["ratio", "p99", "p50", "delta"]
    op: Literal["<=", ">="]
    value: float

    def holds(self, figure: Figure) -> bool:
        actual = {
            "ratio": lambda: figure.ratio,
            "p99": lambda: figure.subject.p99,
            "p50": lambda: figure.subject.p50,
            "delta": lambda: figure.subject.p50 - figure.baseline.p50,
        }[self.on]()
        if not math.isfinite(actual):
            return False
        return actual <= self.value if self.op == "<=" else actual >= self.value

    def text(self, unit: str) -> str:
        suffix = "×" if self.on == "ratio" else f" {unit}"
        return f"{self.on} {self.op} {self.value:g}{suffix}"


@dataclass
class Figure:
    """One line of the table.

    ``ratios`` holds one ratio per round (each from that round's own baseline and subject), and
    ``ratio`` is their median; ``ratio_meaning`` says which way it is taken.
    """

    key: str
    title: str
    unit: str
    subject: Side
    baseline: Side
    ratios: list[float]
    ratio_meaning: str
    setup: str
    target: Target | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return median(self.ratios)

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.holds(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "unit": self.unit,
            "subject": self.subject.to_json(),
            "baseline": self.baseline.to_json(),
            "ratio": self.ratio,
            "ratio_meaning": self.ratio_meaning,
            "ratios_per_round": self.ratios,
            "target": None if self.target is None else self.target.text(self.unit),
            "met": self.met,
            "setup": self.setup,
            "extra": self.extra,
        }


def round_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """One round's ratio: the median of one side over the median of the other."""
    top, bottom = median(numerator), median(denominator)
    return top / bottom if bottom else math.nan


POLAR_LIMIT = 500
"""Polar's production limit: requests a minute per organization."""


def within_polars_limit(
    *,
    key: str,
    title: str,
    subject: str,
    per_minute: float,
    ratio_meaning: str,
    setup: str,
    extra: dict[str, Any],
) -> Figure:
    """Requests a minute (``subject``) against Polar's limit: the ratio must be at most 1."""
    return Figure(
        key=key,
        title=title,
        unit="req/min",
        subject=Side(subject, [per_minute]),
        baseline=Side("Polar's limit", [float(POLAR_LIMIT)]),
        ratios=[per_minute / POLAR_LIMIT],
        ratio_meaning=ratio_meaning,
        setup=setup,
        target=Target("ratio", "<=", 1.0),
        extra=extra,
    )
