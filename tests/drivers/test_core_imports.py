"""The drivers, their shared I/O helpers and the operator's command line use the core only
through what it exports: no module of ``outpost_core`` whose name starts with ``_`` (those may
change with any release)."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest

import outpost_async
import outpost_core
import outpost_io
import outpost_sync

PACKAGES = {
    "outpost_async": Path(outpost_async.__file__).parent,
    "outpost_sync": Path(outpost_sync.__file__).parent,  # its command line (cli/) included
    "outpost_io": Path(outpost_io.__file__).parent,
}


def _core_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for each import of the core in ``path`` (name ``None``: ``import x``)."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.startswith("outpost_core")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("outpost_core"):
            found += [(node.module or "", a.name) for a in node.names]
    return found


PUBLIC_MODULES = {m.name for m in pkgutil.iter_modules(outpost_core.__path__) if m.name[0] != "_"}


def _private(module: str, name: str | None) -> bool:
    parts = module.split(".")[1:]
    if module == "outpost_core" and name is not None:
        return name not in {"__version__", *outpost_core.__all__, *PUBLIC_MODULES}
    return any(part.startswith("_") for part in parts)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_drivers_helpers_and_command_line_import_no_private_core_module(package: str) -> None:
    files = sorted(PACKAGES[package].rglob("*.py"))
    imports = {(path.name, module, name) for path in files for module, name in _core_imports(path)}
    assert any(module == "outpost_core" for _, module, _ in imports)  # the walk sees imports
    private = sorted(
        f"{file}: {module} {name or ''}".strip()
        for file, module, name in imports
        if _private(module, name)
    )
    assert private == []


def test_a_private_import_is_caught() -> None:
    assert _private("outpost_core._redact", "scrub")
    assert _private("outpost_core", "_keys")
    assert not _private("outpost_core", "keys")
    assert not _private("outpost_core.doctor", "Verdict")
    assert not _private("outpost_core", "semconv")
    assert {"doctor", "errors", "public_mode", "semconv", "telemetry", "traces"} == PUBLIC_MODULES
