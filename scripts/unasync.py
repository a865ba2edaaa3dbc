"""Generate the sync driver (and the sync driver tests) from their async sources.

Whole files are rewritten with a table of substitutions, formatted with ruff, and compared whole:
``--check`` fails when any generated file differs from what the sources give, or is missing.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (async source, sync target)
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


def header(source: str) -> str:
    return f"# GENERATED from {source} by scripts/unasync.py: do not edit.\n"


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


def pairs() -> list[tuple[Path, Path]]:
    out = [(ROOT / a, ROOT / b) for a, b in PAIRS]
    for source in sorted(TEST_SOURCE.glob("*.py")):
        if source.name not in HAND_WRITTEN:
            out.append((source, TEST_TARGET / source.name))
    return out


def generated(source: Path, target: Path) -> str:
    text = header(str(source.relative_to(ROOT))) + convert(source.read_text(encoding="utf-8"))
    return tidy(text, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a generated file is stale")
    args = parser.parse_args(argv)
    stale = []
    wanted_targets = set()
    for source, target in pairs():
        wanted_targets.add(target)
        text = generated(source, target)
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(str(target.relative_to(ROOT)))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    # A generated file (driver or test) whose source is gone, or left the list, is stale too.
    for target in [*SYNC_PACKAGE.rglob("*.py"), *TEST_TARGET.glob("*.py")]:
        orphan = target not in wanted_targets
        if orphan and target.read_text(encoding="utf-8").startswith("# GENERATED"):
            if args.check:
                stale.append(str(target.relative_to(ROOT)))
            else:
                target.unlink()
    if stale:
        print("stale generated files (run python scripts/unasync.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
