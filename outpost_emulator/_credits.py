"""Credited units per (customer, meter), as Polar's `meter.credited` events add up."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from outpost_emulator._model import Identity, JsonObject


@dataclass(frozen=True, slots=True)
class Credit:
    seq: int
    identity: Identity
    meter_id: str
    units: int  # negative: a revocation
    at_us: int


class Credits:
    def __init__(self) -> None:
        self._entries: list[Credit] = []

    def grant(self, identity: Identity, meter_id: str, units: int, now_us: int) -> None:
        self._entries.append(Credit(len(self._entries), identity, meter_id, units, now_us))

    def _of(
        self, identities: Collection[Identity], meter_id: str, since_seq: int = 0
    ) -> list[Credit]:
        found = [
            c
            for c in self._entries
            if c.meter_id == meter_id and c.identity in identities and c.seq >= since_seq
        ]
        return sorted(found, key=lambda c: (c.at_us, c.seq))  # Polar orders by timestamp

    def credited(
        self, identities: Collection[Identity], meter_id: str, *, since_seq: int = 0
    ) -> int:
        """The credited units in the window that starts at credit `since_seq` (a reset)."""
        # Polar's non_negative_running_sum: a revocation never takes the total below 0.
        running = 0
        for credit in self._of(identities, meter_id, since_seq):
            running = max(0, running + credit.units)
        return running

    def seqs(self, identities: Collection[Identity], meter_id: str, *, since_seq: int) -> list[int]:
        return [c.seq for c in self._of(identities, meter_id, since_seq)]

    def next_seq(self) -> int:
        return len(self._entries)

    def has_any(self, identities: Collection[Identity], meter_id: str) -> bool:
        return bool(self._of(identities, meter_id))

    def identities(self) -> set[Identity]:
        return {c.identity for c in self._entries}

    def to_json(self) -> list[JsonObject]:
        return [
            {"meter_id": c.meter_id, c.identity[0]: c.identity[1], "units": c.units, "at": c.at_us}
            for c in self._entries
        ]
