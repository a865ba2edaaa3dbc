"""Randomness comes in as data: the machines draw from a generator their driver gives them."""

from __future__ import annotations

from typing import Protocol


class Random(Protocol):
    """What the core needs of ``random.Random``: a uniform draw in [0, 1)."""

    def random(self) -> float: ...
