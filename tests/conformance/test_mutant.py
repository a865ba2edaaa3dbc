"""The model test has teeth: it catches the design document's literal acknowledge rule.

``conformance/mutants/acknowledge_hot_forgets.lua`` acknowledges the way the design document's
write path reads ("a hot bucket counts its events whole, so an acknowledged event just stops
being pending"): in a hot bucket the event leaves the events hash at once. Substituted for
``acknowledge`` in the machine of ``test_model.py``, hypothesis must find a program where the local
balance rises above Polar's, and shrink it to a few steps. The representation check (``a:`` equals
the events hash) is off: the mutant keeps other books on purpose, and must be caught by the
semantic invariant alone.

Two searches: the whole machine (whatever failure hypothesis finds first, a confirm rebuilding
a bucket is the shortest), and the machine with no drop possible, where the only way to fail is
decisions.md D5's case: a snapshot computed before the acknowledgement, applied after it.

See the shrunk programs::

    pytest tests/conformance/test_mutant.py -s
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from outpost_core import SCRIPT_TEXT
from tests.conformance.test_model import machine_for
from tests.support.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
MUTANT = ROOT / "conformance" / "mutants" / "acknowledge_hot_forgets.lua"
MAX_STEPS = 10


def mutant_scripts() -> dict[str, str]:
    """The real scripts, with the mutant (composed with lib.lua, as gen_scripts does) for
    acknowledge."""
    library = (ROOT / "lua" / "lib.lua").read_text(encoding="utf-8")
    return {**SCRIPT_TEXT, "acknowledge": library + "\n" + MUTANT.read_text(encoding="utf-8")}


def shrunk_program(error: BaseException) -> list[str]:
    """The falsifying program hypothesis attached to the error, one step a line."""
    notes = "\n".join(getattr(error, "__notes__", []))
    return [
        line.strip()
        for line in notes.splitlines()
        if line.strip().startswith("state.") and line.strip() != "state.teardown()"
    ]


def find_failure(server: RedisServer, drops: bool) -> list[str]:
    with (
        machine_for(server, mutant_scripts(), check_representation=False, drops=drops) as machine,
        pytest.raises(AssertionError) as caught,
    ):
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=2000,
                stateful_step_count=30,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.generate, Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    program = shrunk_program(caught.value)
    sys.stdout.write(f"\nshrunk failing program (drops={drops}): {caught.value}\n")
    sys.stdout.write("\n".join(program) + "\n")
    assert program, f"hypothesis attached no program: {caught.value!r}"
    assert len(program) <= MAX_STEPS, "\n".join(program)
    return program


def test_the_literal_rule_is_caught(redis_server: RedisServer) -> None:
    find_failure(redis_server, drops=True)


def test_the_literal_rule_fails_on_the_d5_case(redis_server: RedisServer) -> None:
    program = find_failure(redis_server, drops=False)
    steps = [line.split("(")[0] for line in program]
    assert "state.compute_snapshot" in steps and "state.push_snapshot" in steps, program
    assert steps.index("state.compute_snapshot") < steps.index("state.deliver"), program
    assert steps.index("state.deliver") < steps.index("state.push_snapshot"), program
