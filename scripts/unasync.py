"""Generate the sync driver from its async source, and the sync driver tests from theirs.

Whole files are rewritten with a table of substitutions and formatted with ruff.

- ``outpost_sync/_client.py`` is committed (it ships): ``--check`` fails when it differs from what
  its source gives, or when a generated file is left behind in ``outpost_sync/``.
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

# (async source, sync target): the client is the one driver file with ``async`` code in it. What has
# none is shared by both drivers from ``outpost_async._shared`` (never renamed, never generated).
PAIRS = [("outpost_async/_client.py", "outpost_sync/_client.py")]
SYNC_PACKAGE = ROOT / "outpost_sync"
TEST_SOURCE = ROOT / "tests" / "drivers" / "_async"
TEST_TARGET = ROOT / "tests" / "drivers" / "_sync"
HAND_WRITTEN = {"__init__.py", "_concurrency.py"}  # twins that no substitution can produce

SUBSTITUTIONS = [
    (r"\boutpost_async\b(?!\._shared\b)", "outpost_sync"),
    (r"\btests\.drivers\._async\b", "tests.drivers._sync"),
    (r"\bAsyncOutpost\b", "Outpost"),
    (r"\bAsyncClient\b", "Client"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncGenerator\b", "Generator"),
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


def client_header(source: Path) -> str:
    return f"# GENERATED from {source.relative_to(ROOT)} by scripts/unasync.py: do not edit.\n"


def test_header(source: Path) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes() + source.read_bytes()).hexdigest()[:16]
    name = source.relative_to(ROOT) if source.is_relative_to(ROOT) else source.name
    return f"# GENERATED from {name} by scripts/unasync.py ({digest}): not committed.\n"


def is_generated(path: Path) -> bool:
    return path.read_text(encoding="utf-8").startswith("# GENERATED")


def client_orphans() -> list[Path]:
    """Generated files in ``outpost_sync/`` whose source is gone, or left the list."""
    wanted = {ROOT / target for _, target in PAIRS}
    return [t for t in SYNC_PACKAGE.rglob("*.py") if t not in wanted and is_generated(t)]


def check_client() -> list[str]:
    """The committed generated files that differ from what their sources give, or are orphans."""
    stale = []
    for source_name, target_name in PAIRS:
        source, target = ROOT / source_name, ROOT / target_name
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current != generated(source, target, client_header(source)):
            stale.append(target_name)
    return stale + [str(orphan.relative_to(ROOT)) for orphan in client_orphans()]


def write_client() -> None:
    for source_name, target_name in PAIRS:
        source, target = ROOT / source_name, ROOT / target_name
        target.write_text(generated(source, target, client_header(source)), encoding="utf-8")
    for orphan in client_orphans():
        orphan.unlink()


def build_sync_tests(source_dir: Path = TEST_SOURCE, target_dir: Path = TEST_TARGET) -> None:
    """Build each sync test module whose first line does not carry its source's digest, and drop
    the generated ones whose source is gone. Safe to run from several processes at once: each file
    is replaced whole, and builds from the same source are the same."""
    wanted = set()
    for source in sorted(source_dir.glob("*.py")):
        if source.name in HAND_WRITTEN:
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
    parser.add_argument("--check", action="store_true", help="fail if the sync client is stale")
    args = parser.parse_args(argv)
    build_sync_tests()
    if not args.check:
        write_client()
        return 0
    stale = check_client()
    if stale:
        print("stale generated files (run python scripts/unasync.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
