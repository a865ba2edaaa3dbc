"""The emulator stands alone: no module of ``outpost_emulator`` imports the SDK it tests.

It imitates Polar, so sharing code with the core or the drivers would let one bug hide on both
sides of the wire.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import outpost_emulator
from tests.support.imports import imports_of

EMULATOR = Path(outpost_emulator.__file__).resolve().parent
SDK_PACKAGES = frozenset({"outpost_core", "outpost_io", "outpost_sync", "outpost_async"})


def sdk_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of an SDK package, at any depth (also `__import__`)."""
    return imports_of(source, SDK_PACKAGES)


def test_the_check_sees_every_form_of_import() -> None:
    source = (
        "import outpost_core\n"
        "from outpost_async._client import Client\n"
        "def f():\n"
        "    import outpost_sync.x\n"
        "__import__('outpost_core')\n"
        "importlib.import_module('outpost_async')\n"
        "import starlette\n"
    )
    assert [line for line, _ in sdk_imports(source)] == [1, 2, 4, 5, 6]


def emulator_files() -> list[Path]:
    files = sorted(EMULATOR.rglob("*.py"))
    assert EMULATOR / "_state.py" in files
    return files


@pytest.mark.parametrize("path", emulator_files(), ids=lambda p: p.name)
def test_emulator_module_imports_no_sdk_package(path: Path) -> None:
    found = sdk_imports(path.read_text())
    assert found == [], f"{path.name} imports the SDK: {found}"
