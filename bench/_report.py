"""The table printed at the end of a run, and the JSON written beside it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench._stats import Figure


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 100_000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _verdict(figure: Figure) -> str:
    if figure.met is None:
        return ""
    return "met" if figure.met else "MISSED"


def table(figures: list[Figure]) -> str:
    header = (
        "figure",
        "unit",
        "subject p50",
        "p99",
        "baseline p50",
        "p99",
        "ratio",
        "target",
        "",
    )
    rows = [header]
    for f in figures:
        rows.append(
            (
                f.key,
                f.unit,
                _number(f.subject.p50),
                _number(f.subject.p99),
                _number(f.baseline.p50),
                _number(f.baseline.p99),
                _number(f.ratio) + "×",
                "" if f.target is None else f.target.text(f.unit),
                _verdict(f),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    right = {2, 3, 4, 5, 6}
    lines = []
    for n, row in enumerate(rows):
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths).rstrip())
    return "\n".join(lines)


def legend(figures: list[Figure]) -> str:
    """What each figure compares, once per figure."""
    lines = []
    for f in figures:
        lines.append(f"{f.key}: {f.subject.label} vs {f.baseline.label}; ratio = {f.ratio_meaning}")
    return "\n".join(lines)


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null (the smoke test treats null as missing)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(document), indent=2, ensure_ascii=False) + "\n")
