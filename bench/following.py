"""Following many customers, the core alone (no Redis, no emulator): bytes per customer, the cost
of a ``Tick`` and of ``next_deadline()`` with nothing due, and what one reconnect and one
restarted subscription ask for at once. One process per size (``_following_child``), so that RSS
is the process's own."""

from __future__ import annotations

from typing import Any

from bench._child import run_for_json
from bench._env import Env
from bench._stats import Figure, Side

SETUP = (
    "One process per row, a session with a link and no Redis: {n} customers read once each "
    "(the load answered with a hash that holds a snapshot, Polar's snapshot applied, read "
    "again); the last tenth (at most 1,000) read two minutes after the others. Subject: "
    "max_customers={bound}; baseline: no bound. RSS growth per customer followed; a Tick and a "
    "next_deadline() with nothing due (median of 20); a subscription restart's loads and a "
    "WebSocket reconnect's snapshot requests at once."
)
FULL_SIZES = (1_000, 10_000, 100_000, 1_000_000)
SMOKE_SIZES = (200,)
BOUND = 16_000
UNBOUNDED_MAX = 100_000
"""Beyond this, the unbounded side is not run (about 5 KB a customer: 5 GB at a million)."""


def run(env: Env) -> list[Figure]:
    sizes = SMOKE_SIZES if env.scale.name == "smoke" else FULL_SIZES
    bound = 100 if env.scale.name == "smoke" else BOUND
    figures: list[Figure] = []
    for n in sizes:
        bounded = _child(n, bound)
        unbounded = _child(n, 0) if n <= UNBOUNDED_MAX else None
        figures += _rows(n, bound, bounded, unbounded)
    return figures


def _child(n: int, bound: int) -> dict[str, Any]:
    return run_for_json("bench._following_child", n, bound)


def _rows(
    n: int, bound: int, subject: dict[str, Any], baseline: dict[str, Any] | None
) -> list[Figure]:
    setup = SETUP.format(n=f"{n:,}", bound=f"{bound:,}")
    rows = []
    for key, unit, field in (
        ("rss", "MB", "rss"),
        ("tick", "µs", "tick_ns_p50"),
        ("next_deadline", "µs", "next_deadline_ns_p50"),
        ("reconnect_requests", "requests", "reconnect_requests"),
        ("restart_loads", "loads", "restart_loads"),
    ):
        s = _value(subject, field)
        b = _value(baseline, field) if baseline is not None else float("nan")
        rows.append(
            Figure(
                key=f"following.{key}.{n}",
                title=f"{key.replace('_', ' ')}, {n:,} customers read",
                unit=unit,
                subject=Side(f"max_customers={bound:,}", [s]),
                baseline=Side("unbounded" if baseline is not None else "not run", [b]),
                ratios=[s / b if b else float("nan")],
                ratio_meaning="bounded / unbounded",
                setup=setup,
                extra={"bounded": subject, "unbounded": baseline},
            )
        )
    return rows


def _value(result: dict[str, Any], field: str) -> float:
    if field == "rss":
        return float(result["rss_after"] - result["rss_before"]) / 1e6
    if field.endswith("_ns_p50"):
        return float(result[field]) / 1000.0
    return float(result[field])
