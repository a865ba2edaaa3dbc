"""The emulator's controllable clock, shareable with an SDK in the same process."""

from __future__ import annotations

import threading
import time
from datetime import datetime

from outpost_emulator._timeutil import SECOND_US, from_us, to_us


def _wall_us() -> int:
    return time.time_ns() // 1000


class EmulatorClock:
    """A thread-safe clock that runs at a speed factor, can be frozen, advanced or set.

    While running, `virtual = anchor_virtual + (wall - anchor_wall) * speed`. With `speed >= 1`
    and a start at the wall clock it never runs behind the wall clock; only `freeze` and `set`
    can put it there. Readings never go backwards except through `set`.
    """

    def __init__(
        self, start: datetime | None = None, *, speed: float = 1.0, frozen: bool = False
    ) -> None:
        _check_speed(speed)
        self._lock = threading.Lock()
        self._anchor_wall = _wall_us()
        self._anchor_virtual = self._anchor_wall if start is None else to_us(start)
        self._speed = float(speed)
        self._frozen = frozen
        self._last = self._anchor_virtual

    # Reading ---------------------------------------------------------------------------------

    def now_us(self) -> int:
        """Current virtual time, integer microseconds since the Unix epoch."""
        with self._lock:
            return self._read()

    def now(self) -> datetime:
        """Current virtual time as an aware UTC datetime."""
        return from_us(self.now_us())

    def time(self) -> float:
        """Current virtual time in seconds since the epoch (like `time.time()`)."""
        return self.now_us() / SECOND_US

    @property
    def speed(self) -> float:
        with self._lock:
            return self._speed

    @property
    def frozen(self) -> bool:
        with self._lock:
            return self._frozen

    # Control ---------------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the clock forward by `seconds` (>= 0), frozen or running."""
        if not seconds >= 0:  # also rejects NaN
            raise ValueError("advance needs a non-negative number of seconds")
        with self._lock:
            self._rebase(self._read() + round(seconds * SECOND_US))

    def set(self, instant: datetime) -> None:
        """Jump to `instant` (aware datetime), forwards or backwards."""
        target = to_us(instant)
        with self._lock:
            self._rebase(target)
            self._last = target  # an explicit set may go backwards

    def freeze(self) -> None:
        with self._lock:
            if not self._frozen:
                self._rebase(self._read())
                self._frozen = True

    def unfreeze(self) -> None:
        with self._lock:
            if self._frozen:
                self._frozen = False
                self._rebase(self._last)

    def set_speed(self, speed: float) -> None:
        _check_speed(speed)
        with self._lock:
            self._rebase(self._read())
            self._speed = float(speed)

    # Internals (lock held) -------------------------------------------------------------------

    def _read(self) -> int:
        if self._frozen:
            value = self._anchor_virtual
        else:
            elapsed = _wall_us() - self._anchor_wall
            value = self._anchor_virtual + int(elapsed * self._speed)
        # The wall clock may step backwards (NTP); virtual time must not.
        if value < self._last:
            value = self._last
        self._last = value
        return value

    def _rebase(self, virtual_us: int) -> None:
        self._anchor_wall = _wall_us()
        self._anchor_virtual = virtual_us
        self._last = max(self._last, virtual_us)

    def __repr__(self) -> str:
        state = "frozen" if self.frozen else f"speed={self.speed:g}"
        return f"EmulatorClock({self.now().isoformat()}, {state})"


def _check_speed(speed: float) -> None:
    if not speed >= 1:
        raise ValueError("speed must be a number >= 1")
