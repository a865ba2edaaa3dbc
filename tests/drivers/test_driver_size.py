"""The driver stays a package of small modules with one job each: a module that grows past the
limit is a concern that wants a module of its own (the sync twins are generated from the async
modules, so they are checked too)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MOST_LINES = 500  # any driver module
MOST_CLIENT_LINES = 450  # the public client: construction, lifecycle, track, the warm read


def _modules() -> list[Path]:
    return sorted(
        path
        for package in ("outpost_async", "outpost_sync")
        for path in (ROOT / package).glob("*.py")
    )


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_the_drivers_have_modules_to_check() -> None:
    names = {path.name for path in _modules()}
    assert {"_client.py", "_delivery.py", "_backend.py"} <= names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_driver_module_outgrows_one_concern(path: Path) -> None:
    most = MOST_CLIENT_LINES if path.name == "_client.py" else MOST_LINES
    assert _lines(path) <= most, f"{path.name}: {_lines(path)} lines, more than {most}"
