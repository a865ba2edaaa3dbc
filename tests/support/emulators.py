"""The tests' emulators, stopped behind the tests: uvicorn's shutdown waits a fixed 0.1 s for
the connections it asked to close, and each test that started an emulator paid it at its
teardown. Nothing waits on a stopped emulator (its port is its own), so the next test starts
meanwhile; the run waits for every one at its end."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from outpost_emulator import Emulator

_STOPPING: list[threading.Thread] = []


@contextlib.contextmanager
def started(**options: Any) -> Iterator[Emulator]:
    """``Emulator.start(**options)``, stopped on a thread of its own after the ``with``."""
    emulator = Emulator.start(**options)
    try:
        yield emulator
    finally:
        _STOPPING[:] = [thread for thread in _STOPPING if thread.is_alive()]
        stopping = threading.Thread(target=emulator.stop, name="test-emulator-stop", daemon=True)
        stopping.start()
        _STOPPING.append(stopping)


def wait_stopped() -> None:
    """Until every emulator ``started`` made has stopped (at the end of the run)."""
    for thread in _STOPPING:
        thread.join()
    _STOPPING.clear()
