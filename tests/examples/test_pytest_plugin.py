"""The pytest plugin as a merchant gets it: the wheel installed with its ``emulator`` extra into a
new virtual environment, and a new project's short tests using only the plugin's fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

A_MERCHANTS_TESTS = """
import pytest


def test_a_tracked_call_uses_a_credit(outpost, outpost_polar):
    meter = outpost_polar.create_meter("api_call")
    outpost_polar.grant(meter, 3, external_customer_id="alice")
    outpost.track("api_call", external_customer_id="alice")
    assert outpost.balance(meter, external_customer_id="alice").balance == 2
    assert outpost.flush()
    outpost_polar.sync()
    assert outpost_polar.balance(meter, external_customer_id="alice") == 2


@pytest.mark.anyio
async def test_the_async_instance_too(async_outpost, outpost_polar):
    meter = outpost_polar.create_meter("api_call")
    outpost_polar.grant(meter, 1, external_customer_id="bob")
    await async_outpost.track("api_call", external_customer_id="bob")
    assert (await async_outpost.balance(meter, external_customer_id="bob")).balance == 0


@pytest.fixture
def anyio_backend():
    return "asyncio"
"""


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(arg) for arg in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_new_project_tests_its_metering_with_the_plugin(tmp_path: Path) -> None:
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path, ROOT, cwd=tmp_path)
    (wheel,) = tmp_path.glob("polar_outpost-*.whl")
    # No pip of its own (copying it in took 3 s of CPU): this pip installs into it.
    venv.create(tmp_path / "venv", with_pip=False)
    python = tmp_path / "venv" / "bin" / "python"
    install: list[str | Path] = [sys.executable, "-m", "pip", "--python", python, "install", "-q"]
    run(*install, f"{wheel}[emulator]", "pytest", "anyio", cwd=tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_metering.py").write_text(textwrap.dedent(A_MERCHANTS_TESTS))
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL" and not k.startswith("PYTEST")}
    output = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=project, env=env)
    assert "2 passed" in output
