"""The core does no I/O: no module of ``outpost_core`` imports anything that could do it."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

import outpost_core
from tests.support.imports import imports_of

CORE = Path(outpost_core.__file__).resolve().parent
FORBIDDEN = frozenset(
    {
        "socket",
        "ssl",
        "select",
        "selectors",
        "asyncio",
        "threading",
        "multiprocessing",
        "subprocess",
        "time",
        "random",
        "uuid",
        "secrets",
        "os",
        "redis",
        "httpx",
        "httpcore",
        "opentelemetry",
        "outpost_sync",
        "outpost_async",
        "outpost_io",
    }
)


def forbidden_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a forbidden top-level package, at any depth."""
    return imports_of(source, FORBIDDEN)


def core_files() -> list[Path]:
    files = sorted(CORE.rglob("*.py"))
    assert CORE / "_session.py" in files
    return files


KNOWN_VIOLATIONS: dict[str, str] = {}


def core_params() -> list[object]:
    return [
        pytest.param(
            path,
            id=path.name,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_VIOLATIONS[path.name])]
            if path.name in KNOWN_VIOLATIONS
            else [],
        )
        for path in core_files()
    ]


@pytest.mark.parametrize("path", core_params())
def test_no_core_module_imports_io(path: Path) -> None:
    found = forbidden_imports(path.read_text(encoding="utf-8"))
    assert found == [], f"{path.name} imports {found}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os", ["os"]),
        ("import os.path as p", ["os.path"]),
        ("import json, socket", ["socket"]),
        ("from time import monotonic", ["time"]),
        ("from redis.asyncio import Redis", ["redis.asyncio"]),
        ("def f():\n    import random\n    return random.random()", ["random"]),
        ("class C:\n    def m(self):\n        from uuid import uuid4", ["uuid"]),
        ("if True:\n    import asyncio", ["asyncio"]),
        ("try:\n    import httpx\nexcept ImportError:\n    pass", ["httpx"]),
        ("x = __import__('threading')", ["threading"]),
        ("import importlib\nm = importlib.import_module('ssl')", ["ssl"]),
        ("from opentelemetry import trace", ["opentelemetry"]),
        ("from outpost_async import AsyncOutpost", ["outpost_async"]),
        ("from . import time", []),  # a module of the core itself
        ("from .os import x", []),
        ("import timeit, osmosis, randomness", []),
        ("import json\nfrom collections.abc import Mapping", []),
    ],
)
def test_the_check_finds_forbidden_imports(source: str, expected: list[str]) -> None:
    assert [module for _, module in forbidden_imports(source)] == expected


def logging_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of every use of :mod:`logging` but its level constants: the core reports
    lines for its driver to log (a level is data), it never makes or calls a logger."""
    tree = ast.parse(source)
    owner = {id(n.value): n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "logging":
            found += [(node.lineno, f"from logging import {a.name}") for a in node.names]
        elif isinstance(node, ast.Name) and node.id == "logging":
            attr = owner.get(id(node))
            if attr is None:
                found.append((node.lineno, "logging"))  # handed on whole: anything may be called
            elif not isinstance(getattr(logging, attr, None), int):
                found.append((node.lineno, f"logging.{attr}"))
    return found


@pytest.mark.parametrize("path", core_files(), ids=lambda p: p.name)
def test_no_core_module_logs(path: Path) -> None:
    assert logging_uses(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import logging\nlevel = logging.WARNING", []),
        ("import logging\nlogging.getLogger('outpost').warning('x')", ["logging.getLogger"]),
        ("import logging\nlog = logging.log", ["logging.log"]),
        ("import logging\nf(logging)", ["logging"]),
        ("from logging import getLogger", ["from logging import getLogger"]),
    ],
)
def test_the_check_finds_a_logger(source: str, expected: list[str]) -> None:
    assert [name for _, name in logging_uses(source)] == expected
