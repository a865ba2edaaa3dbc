"""Each driver stands alone: importing one never loads the other. What both use lives in
``outpost_io``, a package neither driver owns, so ``import outpost_sync`` in a Django or Flask
process does not load the asyncio driver (nor the other way round)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def loaded_after(module: str, probe: str) -> bool:
    """Whether importing ``module`` in a fresh interpreter loads ``probe``."""
    code = f"import {module}, sys; print({probe!r} in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip() == "True"


@pytest.mark.parametrize(
    ("imported", "other"),
    [("outpost_sync", "outpost_async"), ("outpost_async", "outpost_sync")],
)
def test_importing_one_driver_does_not_import_the_other(imported: str, other: str) -> None:
    assert loaded_after(imported, imported)  # the probe itself works
    assert not loaded_after(imported, other)


def test_the_sync_command_line_does_not_import_the_async_driver() -> None:
    assert not loaded_after("outpost_sync.cli", "outpost_async")
