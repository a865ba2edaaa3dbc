"""A benchmark's helper process, driven line by line over its stdin and stdout.

The processes (``_tracker``, ``_loader``) take the driver as their first argument, say ``ready``
once set up, answer one line per command, and leave on ``q``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_for_json(module: str, *arguments: object) -> dict[str, Any]:
    """Run ``python -m <module> <arguments>`` to its end; what it printed last, read as JSON."""
    done = subprocess.run(
        [sys.executable, "-m", module, *map(str, arguments)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


class ChildProcess:
    def __init__(self, arguments: list[str]) -> None:
        self._process = subprocess.Popen(
            arguments, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._in, self._out = self._process.stdin, self._process.stdout

    def ready(self) -> None:
        """Wait for its ``ready`` line; a process that says anything else is stopped."""
        if self._out.readline().strip() != "ready":
            self.close()
            raise RuntimeError("a benchmark's helper process did not start")

    def send(self, line: str) -> None:
        self._in.write(line + "\n")
        self._in.flush()

    def line(self) -> str:
        return self._out.readline()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._in.write("q\n")
            self._in.close()
        try:
            self._process.wait(15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(5)
        self._out.close()


class AsyncChildProcess:
    """The asyncio twin of :class:`ChildProcess`; the caller closes it, even when it never
    said ``ready``."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._process, self._in, self._out = process, process.stdin, process.stdout

    @classmethod
    async def start(cls, arguments: list[str]) -> AsyncChildProcess:
        pipe = asyncio.subprocess.PIPE
        return cls(
            await asyncio.create_subprocess_exec(*arguments, cwd=ROOT, stdin=pipe, stdout=pipe)
        )

    async def ready(self) -> None:
        """Wait for its ``ready`` line."""
        if (await self.line()).strip() != b"ready":
            raise RuntimeError("a benchmark's helper process did not start")

    async def send(self, line: str) -> None:
        self._in.write(line.encode() + b"\n")
        await self._in.drain()

    async def line(self) -> bytes:
        return await self._out.readline()

    async def close(self) -> None:
        with contextlib.suppress(OSError):
            self._in.write(b"q\n")
            self._in.close()
        try:
            await asyncio.wait_for(self._process.wait(), 15)
        except TimeoutError:
            self._process.kill()
            await self._process.wait()


def main_by_driver(
    sync: Callable[..., None], asynchronous: Callable[..., Coroutine[Any, Any, None]]
) -> None:
    """A helper process's ``main()``: ``sync`` or ``asynchronous`` by the first argument."""
    driver, *rest = sys.argv[1:]
    if driver == "sync":
        sync(*rest)
    else:
        asyncio.run(asynchronous(*rest))
