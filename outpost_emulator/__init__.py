"""Polar side of Outpost, runnable locally: `Emulator.start()` or `outpost emulator`.

Its server needs the ``emulator`` extra (Starlette, uvicorn). The names below are imported on first
use, so that ``outpost`` can tell a user without the extra what to install instead of failing on
an import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outpost_emulator._admin import EmulatorError
    from outpost_emulator._clock import EmulatorClock
    from outpost_emulator._server import Emulator
    from outpost_emulator.app import create_app

__all__ = ["Emulator", "EmulatorClock", "EmulatorError", "create_app"]

_HOMES = {
    "Emulator": "outpost_emulator._server",
    "EmulatorClock": "outpost_emulator._clock",
    "EmulatorError": "outpost_emulator._admin",
    "create_app": "outpost_emulator.app",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'outpost_emulator' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later lookups do not come here
    return value
