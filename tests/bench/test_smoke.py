"""``python -m bench --smoke`` runs every benchmark with tiny counts, so they never rot.

It checks that every figure comes out, finite; never how fast anything is (the full run,
``python -m bench``, is not part of CI).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench._runner import EXPECTED

ROOT = Path(__file__).resolve().parents[2]


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _failure(done: subprocess.CompletedProcess[str], log: Path) -> str:
    """What failed first (a failed benchmark's traceback, the instances' warnings), then the
    table: CI keeps only so much of a failure's text, and the cause must come first."""
    logged = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
    return f"stderr:\n{done.stderr}\nlog (tail):\n{logged}\nstdout:\n{done.stdout}"


@pytest.mark.slow
@pytest.mark.timeout(620)  # hang guards, not limits: beside two busy processes it took over 220 s
def test_the_smoke_run_prints_and_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "POLAR_ACCESS_TOKEN")}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, _failure(done, out.with_suffix(".log"))
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    assert document["errors"] == {}
    figures = document["figures"]
    assert sorted(figures) == sorted(EXPECTED)
    for key, figure in figures.items():
        assert key in done.stdout, f"{key} missing from the table"
        for side in ("subject", "baseline"):
            for stat in ("p50", "p99", "mean"):
                assert _finite(figure[side][stat]), (key, side, stat, figure[side][stat])
            assert figure[side]["n"] > 0, (key, side)
        assert _finite(figure["ratio"]), (key, figure["ratio"])
        assert figure["ratios_per_round"] and all(map(_finite, figure["ratios_per_round"])), key
    machine = document["machine"]
    for field in ("platform", "cpu", "python", "redis_server", "hiredis"):
        assert field in machine, field
    assert machine["redis_server"]
