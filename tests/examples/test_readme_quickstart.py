"""The README's quickstart, as printed: its seed command against an emulator, then its Python block
in a new process with the environment the seed script exported. The README cannot drift."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from outpost_emulator import Emulator

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- quickstart:"


def quickstart() -> tuple[str, str]:
    """The quickstart's shell block and the Python block the marker comment announces."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quickstart") :]
    shell = re.search(r"```sh\n(.*?)```", section, re.S)
    python = re.search(re.escape(MARKER) + r".*?-->\n```python\n(.*?)```", section, re.S)
    assert shell and python, "the README's quickstart lost its shell or its marked Python block"
    return shell.group(1), python.group(1)


def seed_command(shell: str) -> list[str]:
    """The block's `eval "$(python examples/seed_emulator.py ...)"` line, as an argument list."""
    found = re.search(r'eval "\$\((python examples/seed_emulator\.py[^)]*)\)"', shell)
    assert found, "the quickstart no longer runs examples/seed_emulator.py"
    return [sys.executable, *shlex.split(found.group(1))[1:]]


def test_the_readme_quickstart_prints_the_balance_it_promises(
    outpost_emulator: Emulator, outpost_redis_url: str
) -> None:
    shell, code = quickstart()
    assert "outpost emulator &" in shell
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POLAR_", "OUTPOST_"))}
    # What `outpost emulator` and a Redis on localhost give the reader, on this test's ports.
    env |= {
        "POLAR_SERVER_URL": outpost_emulator.url,
        "POLAR_ACCESS_TOKEN": outpost_emulator.token,
        "REDIS_URL": outpost_redis_url,
        "POLAR_OUTPOST_TELEMETRY": "0",
    }
    seeded = subprocess.run(
        seed_command(shell), cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert seeded.returncode == 0, seeded.stderr
    for line in seeded.stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0]
    assert "OUTPOST_METER_ID" in env
    promised = re.search(r"# (\S+)\s*$", code.strip())
    assert promised, "the block's last line says what it prints"
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == promised.group(1)
