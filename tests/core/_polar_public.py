"""A model of Polar's public customer meter, for the public-mode ledger's tests (no I/O).

Time is microseconds on Polar's clock; Outpost's clock runs ``skew_us`` ahead (negative:
behind). An event of Outpost's is committed by Polar (``ingested_at``) and then acknowledged;
a recompute reads usage ``gap_us`` before it stamps ``modified_at``; the window starts at the
latest reset's ingestion time; credits add up as a non-negative running sum since the reset.
"""

from __future__ import annotations

import attrs

from outpost_core._public_readings import PolarReading

S = 1_000_000


@attrs.define
class PolarMeter:
    aggregation: str = "sum"
    skew_us: int = 0
    now_us: int = 1_800_000_000 * S
    commits: list[tuple[int, float]] = attrs.Factory(list)  # (ingested_at, value)
    credits: list[tuple[int, int]] = attrs.Factory(list)  # (at, units)
    reset_at_us: int = 0
    row: PolarReading | None = None
    activated: bool = False
    readings: list[PolarReading] = attrs.Factory(list)  # every reading Polar sent, in order

    def tick(self, us: int = 1000) -> None:
        self.now_us += us

    def outpost_now(self) -> int:
        return self.now_us + self.skew_us

    def commit(self, value: float) -> None:
        self.tick()
        self.commits.append((self.now_us, value))

    def _credited(self) -> int:
        running = 0
        for at, units in self.credits:
            if at >= self.reset_at_us:
                running = max(0, running + units)
        return running

    def true_consumed(self, before_us: int | None = None) -> float:
        values = [
            v
            for at, v in self.commits
            if at >= self.reset_at_us and (before_us is None or at < before_us)
        ]
        if self.aggregation == "max":
            return max(values, default=0.0)
        return float(sum(values))

    def true_balance(self) -> float:
        return self._credited() - self.true_consumed()

    def true_credited(self) -> int:
        return self._credited()

    def probe(self, lag_us: int = 0) -> float:
        """A quantities answer for the current window, from a replica ``lag_us`` behind."""
        self.tick()
        return self.true_consumed(before_us=self.now_us - lag_us)

    def recompute(self, gap_us: int = 0) -> PolarReading:
        self.tick()
        consumed = self.true_consumed(before_us=self.now_us - gap_us)
        credited = self._credited()
        self.activated = True
        return self._emit(consumed, credited)

    def _emit(self, consumed: float, credited: int) -> PolarReading:
        reading = PolarReading(
            "c1", None, "m1", consumed, credited, credited - consumed, self.now_us
        )
        self.row = reading
        self.readings.append(reading)
        return reading

    def activate(self) -> PolarReading | None:
        """A matching ingest activates a row that was never activated: modified_at moves, the
        figures stay (zero: such a row was never recomputed with events)."""
        self.tick()
        if self.activated:
            return None
        self.activated = True
        return self._emit(0.0, self._credited())

    def grant(self, units: int) -> PolarReading:
        self.tick()
        self.credits.append((self.now_us, units))
        return self.recompute()

    def cycle(self, units: int) -> PolarReading:
        self.tick()
        self.reset_at_us = self.now_us
        self.credits.append((self.now_us, units))
        return self.recompute()
