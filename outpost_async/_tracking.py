"""Writing one event for ``track()``: the track script, this instance's own change coming back
over pub/sub (its echo), and the durability wait.

The session turns the event into the script to run (``Session.track``) and gives it a ticket
(``Session.script_sent``); the reply goes back with it, and the session applies it after any change
it held as maybe this script's echo, so the copies apply changes in the order Redis made them.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, NamedTuple

from outpost_async._context import DriverContext
from outpost_async._effects import SessionEffects
from outpost_async._reads import Reads
from outpost_async._scripts import run_echoed
from outpost_core import (
    Durability,
    NotDurable,
    NotReady,
    event_id_of,
    semconv,
    timestamp_us_of,
)
from outpost_io.ids import new_event_id


class TrackCall(NamedTuple):
    """What a ``track()`` call names: the event, its customer, and what the caller fixed of it
    (``None``: its timestamp is the call's time, its id one made up)."""

    name: str
    external_customer_id: str | None
    customer_id: str | None
    metadata: dict[str, Any] | None
    timestamp: datetime | None
    event_id: str | None

    def arguments(self, now_us: int) -> dict[str, Any]:
        """``Session.track``'s arguments for this call made at ``now_us``."""
        return dict(
            name=self.name,
            external_customer_id=self.external_customer_id,
            customer_id=self.customer_id,
            metadata=self.metadata,
            timestamp_us=timestamp_us_of(self.timestamp, now_us),
            now_us=now_us,
            event_id=event_id_of(self.event_id, new_event_id()),
        )


class Tracking:
    def __init__(
        self, context: DriverContext, effects: SessionEffects, reads: Reads, durability: Durability
    ) -> None:
        self._context = context
        self._effects = effects
        self._reads = reads
        self._durability = durability

    async def write(self, call: TrackCall, started: int) -> str:
        """Write the event; return its id (``started``: when track() was called, for telemetry)."""
        ctx = self._context
        arguments = call.arguments(ctx.now_us())
        written: str = arguments["event_id"]
        try:
            with ctx.lock:
                run = ctx.session.track(**arguments)
                ticket = ctx.session.script_sent()
        except NotReady:
            await self._reads.wait_for_configuration()
            with ctx.lock:
                run = ctx.session.track(**arguments)
                ticket = ctx.session.script_sent()
        reply, shortfall = await run_echoed(ctx, self._effects, run, ticket, self._durability)
        await self._effects.replied(reply, ticket)
        if shortfall:
            raise NotDurable(f"event {written} is on the primary only: {shortfall}", written)
        if ctx.telemetry.enabled:
            elapsed = time.perf_counter_ns() - started
            ctx.telemetry.recorder.tracked(
                call.external_customer_id,
                call.customer_id,
                run.meter_ids,
                elapsed,
                semconv.OK,
                run.buckets,
            )
        return written
