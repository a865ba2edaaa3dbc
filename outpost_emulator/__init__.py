"""Polar side of Outpost, runnable locally: `Emulator.start()` or `outpost emulator`."""

from __future__ import annotations

from outpost_emulator._admin import EmulatorError
from outpost_emulator._clock import EmulatorClock
from outpost_emulator._server import Emulator
from outpost_emulator.app import create_app

__all__ = ["Emulator", "EmulatorClock", "EmulatorError", "create_app"]
