"""Run the model test once, in this process, and say whether it failed: the child process of
``test_mutant.py`` and ``measure_mutants.py``.

    python -m tests.conformance.hunt --seed 3 [--examples N] [--steps N] [--lua DIR]

It runs ``test_model.py``'s machine as the suite configures it (``run_model``), from a fixed seed,
without shrinking (a mutant is caught or not in the generate phase; shrinking only makes the
program shorter). ``--lua`` composes the scripts from another ``lua/`` directory (a mutant's);
a core mutant is whatever ``outpost_core`` comes first on ``PYTHONPATH``. Prints one JSON line:
``{"caught": bool, "error": <exception type>, "message": ..., "program": [steps], "seconds": s,
"core": <path of the outpost_core imported>}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import outpost_core
from outpost_core import SCRIPT_TEXT
from tests.conformance.test_model import EXAMPLES, STEPS, machine_for, run_model
from tests.support.redis_server import RedisServer


def compose(lua: Path) -> dict[str, str]:
    """Each script as Redis runs it: lib.lua, a newline, the script (as gen_scripts composes)."""
    library = (lua / "lib.lua").read_text(encoding="utf-8")
    return {
        name: library + "\n" + (lua / f"{name}.lua").read_text(encoding="utf-8")
        for name in SCRIPT_TEXT
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--examples", type=int, default=EXAMPLES)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--lua", type=Path, default=None)
    options = parser.parse_args()
    scripts = SCRIPT_TEXT if options.lua is None else compose(options.lua)
    server = RedisServer()
    server.start()
    start = time.monotonic()
    result: dict[str, object] = {"caught": False, "core": outpost_core.__file__}
    try:
        # Judged on the semantic invariants alone (as test_mutant.py does): a mutant may keep
        # other books than the scripts' on purpose.
        with machine_for(server, scripts, check_representation=False) as machine:
            run_model(
                machine,
                examples=options.examples,
                steps=options.steps,
                seed_=options.seed,
                shrink=False,
            )
    except Exception as error:  # any failure of the model test is a catch
        result.update(
            caught=True,
            error=type(error).__name__,
            message=str(error)[:2000],
            program=list(getattr(error, "__notes__", [])),
        )
    finally:
        server.close()
    result["seconds"] = round(time.monotonic() - start, 2)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
