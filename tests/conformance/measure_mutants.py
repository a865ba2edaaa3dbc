"""Catch rates of the checked-in mutants: each runs against the model test as the suite
configures it (``EXAMPLES`` programs of ``STEPS`` steps), once per seed, in parallel children.

    python -m tests.conformance.measure_mutants [--seeds 1-10] [--jobs 2] [--examples N] [name...]

Prints one JSON line per run, then a table: mutant, runs caught, mean seconds to the catch.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.conformance._mutants import all_mutants, hunt


def run(mutant: Path, seed: int, examples: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        verdict = hunt(mutant, Path(scratch), seed, examples)
    line = {"mutant": mutant.stem, "seed": seed, **verdict}
    sys.stdout.write(json.dumps({k: line.get(k) for k in ("mutant", "seed", "caught", "seconds")}))
    sys.stdout.write("\n")
    sys.stdout.flush()
    return line


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="1-10")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--examples", type=int, default=None)
    parser.add_argument("names", nargs="*")
    options = parser.parse_args()
    first, _, last = options.seeds.partition("-")
    seeds = range(int(first), int(last or first) + 1)
    mutants = [m for m in all_mutants() if not options.names or m.stem in options.names]
    with ThreadPoolExecutor(options.jobs) as pool:
        futures = [pool.submit(run, m, s, options.examples) for m in mutants for s in seeds]
        results = [f.result() for f in futures]
    for mutant in mutants:
        mine = [r for r in results if r["mutant"] == mutant.stem]
        caught = [r for r in mine if r["caught"]]
        mean = sum(r["seconds"] for r in caught) / len(caught) if caught else float("nan")
        sys.stdout.write(f"{mutant.stem:40} {len(caught)}/{len(mine)} caught, {mean:.1f} s\n")


if __name__ == "__main__":
    main()
