"""What a Python source imports, as the tests that keep a package independent read it."""

from __future__ import annotations

import ast


def imports_of(source: str, packages: frozenset[str]) -> list[tuple[int, str]]:
    """(line, module) of every absolute import of one of ``packages`` (top-level names), at any
    depth: ``import``, ``from ... import``, and ``__import__`` or ``import_module`` called with a
    literal name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and getattr(node.func, "id", getattr(node.func, "attr", None))
            in ("__import__", "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            modules = [node.args[0].value]
        line = getattr(node, "lineno", 0)
        found += [(line, m) for m in modules if m.split(".")[0] in packages]
    return found
