"""Generate the sync driver from its async source, and the sync driver tests from theirs.

Whole files are rewritten with a table of substitutions and formatted with ruff.

- The sync driver's modules are committed (they ship): every module of ``outpost_async/`` but the
  hand-written ones (:data:`HAND_WRITTEN_DRIVER`) is the source of its namesake in
  ``outpost_sync/``. ``--check`` fails when a generated module differs from what its source gives,
  is missing, or is left behind in ``outpost_sync/`` with no source.
- The sync driver tests are not committed: ``tests/conftest.py`` builds them before pytest collects
  (``build_sync_tests``), and ``./dev test`` before mypy reads them. Each carries a digest of its
  source and of this script in its first line, so an up-to-date one is not built again.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ASYNC_PACKAGE = ROOT / "outpost_async"
SYNC_PACKAGE = ROOT / "outpost_sync"
# Each driver writes these by hand (as httpcore keeps its ``_backends/``): what asyncio or threads
# do differently (``_backend.py``, ``_batches.py``), the async-only shared connection and its push
# reader, and the package's front page. Everything else in ``outpost_async/`` is generated into
# ``outpost_sync/``.
HAND_WRITTEN_DRIVER = {
    "__init__.py",
    "_backend.py",
    "_batches.py",
    "_multiplexed.py",
    "_listener.py",
}
TEST_SOURCE = ROOT / "tests" / "drivers" / "_async"
TEST_TARGET = ROOT / "tests" / "drivers" / "_sync"
HAND_WRITTEN_TESTS = {"__init__.py", "_concurrency.py"}  # twins that no substitution can produce

SUBSTITUTIONS = [
    (r"\boutpost_async\b", "outpost_sync"),
    (r"\btests\.drivers\._async\b", "tests.drivers._sync"),
    (r"\bAsyncOutpost\b", "Outpost"),
    (r"\bAsyncReservation\b", "Reservation"),
    (r"\bAsyncClient\b", "Client"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncGenerator\b", "Generator"),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\bAwaitable\[([^\[\]]+)\]", r"\1"),
    (r"\bfrom redis\.asyncio import\b", "from redis import"),
    (r"\bredis\.asyncio\b", "redis"),
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\.aclose\(\)", ".close()"),
    (r"\.aiter_bytes\(", ".iter_bytes("),
    (r"\banyio_backend\b", "sync_backend"),
    (r"^\s*@pytest\.mark\.anyio\n", ""),
    (r"\basync_instance\b", "sync_instance"),
    (r"\basync_driver\b", "sync_driver"),
]


def convert(text: str) -> str:
    for pattern, replacement in SUBSTITUTIONS:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    return text


def ruff(text: str, path: Path, *command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--stdin-filename", str(path), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if done.returncode not in (0, 1) or not done.stdout:
        raise RuntimeError(f"ruff {' '.join(command)} failed on {path}: {done.stderr}")
    return done.stdout


def tidy(text: str, path: Path) -> str:
    """Sort imports (the renames reorder them) and drop the ones left unused, then format."""
    sorted_imports = ruff(text, path, "check", "--select", "I,F401", "--fix", "--quiet")
    return ruff(sorted_imports, path, "format")


def generated(source: Path, target: Path, first_line: str) -> str:
    return tidy(first_line + convert(source.read_text(encoding="utf-8")), target)


def driver_header(source: Path) -> str:
    name = f"{source.parent.name}/{source.name}"  # outpost_async/<module>, wherever it sits
    return f"# GENERATED from {name} by scripts/unasync.py: do not edit.\n"


def test_header(source: Path) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes() + source.read_bytes()).hexdigest()[:16]
    name = source.relative_to(ROOT) if source.is_relative_to(ROOT) else source.name
    return f"# GENERATED from {name} by scripts/unasync.py ({digest}): not committed.\n"


def is_generated(path: Path) -> bool:
    with path.open(encoding="utf-8") as file:
        return file.readline().startswith("# GENERATED")


def driver_pairs(
    source_dir: Path = ASYNC_PACKAGE, target_dir: Path = SYNC_PACKAGE
) -> dict[Path, Path]:
    """Each generated sync module, and its async source: the whole package but the hand-written
    modules (only its top level: ``outpost_sync/cli/`` is the sync driver's own)."""
    return {
        target_dir / source.name: source
        for source in sorted(source_dir.glob("*.py"))
        if source.name not in HAND_WRITTEN_DRIVER
    }


def driver_orphans(target_dir: Path, wanted: dict[Path, Path]) -> list[Path]:
    """Generated modules in the sync package whose source is gone, or became hand-written."""
    return sorted(t for t in target_dir.glob("*.py") if t not in wanted and is_generated(t))


def check_driver(source_dir: Path = ASYNC_PACKAGE, target_dir: Path = SYNC_PACKAGE) -> list[str]:
    """The generated sync modules that are stale (differ, whole file, from what their sources
    give), missing, or left with no source; empty when the committed sync driver is current."""
    pairs = driver_pairs(source_dir, target_dir)
    wrong = []
    for target, source in pairs.items():
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current != generated(source, target, driver_header(source)):
            wrong.append(target)
    wrong += driver_orphans(target_dir, pairs)
    return [str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path) for path in wrong]


def write_driver(source_dir: Path = ASYNC_PACKAGE, target_dir: Path = SYNC_PACKAGE) -> None:
    pairs = driver_pairs(source_dir, target_dir)
    for target, source in pairs.items():
        text = generated(source, target, driver_header(source))
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
    for orphan in driver_orphans(target_dir, pairs):
        orphan.unlink()


def build_sync_tests(source_dir: Path = TEST_SOURCE, target_dir: Path = TEST_TARGET) -> None:
    """Build each sync test module whose first line does not carry its source's digest, and drop
    the generated ones whose source is gone. Safe to run from several processes at once: each file
    is replaced whole, and builds from the same source are the same."""
    wanted = set()
    for source in sorted(source_dir.glob("*.py")):
        if source.name in HAND_WRITTEN_TESTS:
            continue
        target = target_dir / source.name
        wanted.add(target)
        first_line = test_header(source)
        if target.exists():
            with target.open(encoding="utf-8") as current:
                if current.readline() == first_line:
                    continue
        scratch = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        scratch.write_text(generated(source, target, first_line), encoding="utf-8")
        os.replace(scratch, target)
    for target in target_dir.glob("*.py"):
        if target not in wanted and is_generated(target):
            target.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="fail if a generated sync module is stale"
    )
    args = parser.parse_args(argv)
    build_sync_tests()
    if not args.check:
        write_driver()
        return 0
    stale = check_driver()
    if stale:
        print("stale generated files (run python scripts/unasync.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
