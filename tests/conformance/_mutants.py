"""The checked-in mutants of ``conformance/mutants/``, and running the model test against one.

A mutant is one of:

* ``<name>.patch``: a unified diff against the repository (``a/lua/...`` or
  ``a/outpost_core/...``), one small change, with a paragraph before the diff saying what it
  breaks. It is applied by :func:`apply_patch`, which finds each hunk's lines by their text, not
  their line numbers, so it keeps applying while the code around it moves; when the lines it
  changes are gone it fails loudly (re-make the mutant against the new code).
* ``<name>.lua``: a whole script substituted for the one its first line names
  (``-- MUTANT of acknowledge.lua``).

:func:`hunt` copies ``outpost_core/`` and ``lua/`` into a scratch directory, mutates the copy,
and runs ``tests.conformance.hunt`` there in a child process: the copy's ``outpost_core`` is the
one imported, and the scripts are composed from the copy's ``lua/``. A child process keeps the
mutated core out of this one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = ROOT / "conformance" / "mutants"


class StaleMutant(Exception):
    """A mutant's hunk no longer matches the code it changes."""


def all_mutants() -> list[Path]:
    return sorted([*MUTANTS.glob("*.patch"), *MUTANTS.glob("*.lua")])


def apply_patch(patch: str, root: Path) -> list[str]:
    """Apply a unified diff to the files under ``root``; return the paths it changed. Every
    hunk's old lines (context and removals) must occur exactly once in its file."""
    changed: list[str] = []
    path: str | None = None
    hunks: list[tuple[list[str], list[str]]] = []

    def flush() -> None:
        if path is None:
            return
        target = root / path
        text = target.read_text(encoding="utf-8")
        for old, new in hunks:
            before, after = "".join(old), "".join(new)
            found = text.count(before)
            if found != 1:
                raise StaleMutant(f"{path}: a hunk's lines occur {found} times, not once")
            text = text.replace(before, after)
        target.write_text(text, encoding="utf-8")
        changed.append(path)

    for line in patch.splitlines(keepends=True):
        if line.startswith("--- "):
            flush()
            path, hunks = None, []
        elif line.startswith("+++ "):
            path = re.sub(r"^\+\+\+ b/", "", line.rstrip("\n")).split("\t")[0]
        elif line.startswith("@@"):
            hunks.append(([], []))
        elif hunks and line[:1] in (" ", "-", "+"):
            old, new = hunks[-1]
            if line[0] != "+":
                old.append(line[1:])
            if line[0] != "-":
                new.append(line[1:])
    flush()
    if not changed:
        raise StaleMutant("the patch changes no file")
    return changed


def mutate(mutant: Path, into: Path) -> list[str]:
    """A copy of ``outpost_core/`` and ``lua/`` in ``into``, with the mutant applied."""
    for package in ("outpost_core", "lua"):
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / package, into / package, ignore=ignore)
    text = mutant.read_text(encoding="utf-8")
    if mutant.suffix == ".patch":
        return apply_patch(text, into)
    match = re.match(r"-- MUTANT of (\w+\.lua)", text)
    if match is None:
        raise StaleMutant(f"{mutant.name}: the first line must be '-- MUTANT of <script>.lua'")
    (into / "lua" / match[1]).write_text(text, encoding="utf-8")
    return [f"lua/{match[1]}"]


def hunt(
    mutant: Path, scratch: Path, seed: int, examples: int | None = None, timeout: float = 900.0
) -> dict[str, Any]:
    """Run the model test once against the mutant (in ``scratch``, a fresh directory); the
    child's JSON verdict (see ``tests/conformance/hunt.py``)."""
    mutate(mutant, scratch)
    command = [sys.executable, "-m", "tests.conformance.hunt", "--seed", str(seed)]
    command += ["--lua", str(scratch / "lua")]
    if examples is not None:
        command += ["--examples", str(examples)]
    # The scratch directory is the working directory, so it comes first on sys.path: its
    # outpost_core is the one imported; tests come from the repository.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(scratch), str(ROOT)])}
    done = subprocess.run(
        command, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the model test did not run (exit {done.returncode}):\n{done.stderr}")
    verdict: dict[str, Any] = json.loads(lines[-1])
    core = Path(verdict["core"]).resolve()
    if scratch.resolve() not in core.parents:
        raise RuntimeError(f"the child imported {core}, not the mutated copy")
    return verdict
