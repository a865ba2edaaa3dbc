# GENERATED from outpost_async/_reservation.py by scripts/unasync.py: do not edit.
"""Exact admission for the driver: reservations and conditional tracks (docs/admission.md).

What an admission means is decided by ``outpost_core.admission`` and the scripts; this module runs
them the way ``_tracking.py`` runs the track script (echoes, durability, the session's effects).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from outpost_core import (
    Customer,
    Durability,
    NotDurable,
    NotReady,
    OutpostClosed,
    RunScript,
    UsageError,
    admission,
    admission_outcome,
    customer_of,
    semconv,
)
from outpost_io.ids import new_event_id
from outpost_sync._context import DriverContext
from outpost_sync._effects import SessionEffects
from outpost_sync._reads import Reads
from outpost_sync._scripts import run_echoed
from outpost_sync._tracking import TrackCall


class Reservation:
    """Units of one meter held for one customer until :meth:`commit` or :meth:`release`, or until
    the hold expires (``ttl`` seconds after it was taken).

    ``with`` releases it on exit unless it was committed (on an exception too)."""

    def __init__(self, admissions: Admissions, hold: admission.Hold, units: float) -> None:
        self._admissions = admissions
        self._hold = hold
        self.units = units
        """The units held."""
        self.meter_id = hold.meter_id
        self.committed: str | None = None
        """The id of the event :meth:`commit` recorded, once it did."""
        self.released = False

    @property
    def expires_at_us(self) -> int:
        """When the hold expires (µs since the epoch, the instance's clock)."""
        return self._hold.expires_us

    def commit(
        self,
        name: str,
        *,
        metadata: dict[str, Any] | None = None,
        timestamp: datetime | None = None,
        event_id: str | None = None,
    ) -> str:
        """Record the actual event (its value may be more or less than what was held: the usage
        happened) and release the hold, in one script; return the event's id. After the hold
        expired, the event is still recorded. Raises as ``track()``."""
        if self.committed is not None or self.released:
            raise UsageError("this reservation was already committed or released")
        external, own = _names(self._hold.customer)
        call = TrackCall(name, external, own, metadata, timestamp, event_id)
        self.committed = self._admissions.track(call, hold=self._hold)
        return self.committed

    def release(self) -> None:
        """Free the held units now (nothing is recorded). Releasing twice does nothing."""
        if self.committed is not None or self.released:
            return
        self._admissions.release(self._hold)
        self.released = True

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "committed" if self.committed else "released" if self.released else "open"
        return f"<Reservation {self.units:g} of {self.meter_id} for {self._hold.customer} {state}>"


class Admissions:
    """``reserve()``, ``track(require_balance=True)`` and a reservation's commit and release."""

    def __init__(
        self,
        context: DriverContext,
        effects: SessionEffects,
        reads: Reads,
        durability: Durability,
        start: Callable[[], None],
    ) -> None:
        self._context = context
        self._effects = effects
        self._reads = reads
        self._durability = durability
        self._start = start  # the instance starts its loops at its first call

    def reserve(
        self,
        meter_id: str,
        units: float,
        external_customer_id: str | None,
        customer_id: str | None,
        ttl: float,
    ) -> Reservation:
        meters = [meter_id]
        with self._recorded(semconv.RESERVE, external_customer_id, customer_id, meters):
            admission.check_request(units, ttl)
            ctx = self._context
            if ctx.closed:  # a warm customer needs no read below, which would refuse it
                raise OutpostClosed("this Outpost instance is closed")
            # The customer's state loaded and Polar's snapshot applied, as for a first read (and its
            # other names known): what the script then reads in Redis is the whole picture.
            self._ready(meter_id, external_customer_id, customer_id)
            with ctx.lock:
                run, hold = admission.reserve(
                    ctx.session,
                    meter_id,
                    units,
                    external_customer_id,
                    customer_id,
                    ttl=ttl,
                    now_us=ctx.now_us(),
                    hold_id=new_event_id(),
                    one_slot=ctx.cluster is not None,
                )
                ticket = ctx.session.script_sent()
            refusal = self._run(run, ticket)
            if refusal is not None:
                raise refusal.error(hold.units)
            return Reservation(self, hold, hold.units)

    def release(self, hold: admission.Hold) -> None:
        ctx = self._context
        external, own = _names(hold.customer)
        with self._recorded(semconv.RELEASE, external, own, [hold.meter_id]):
            with ctx.lock:
                run = admission.release(ctx.session, hold, ctx.now_us())
                ticket = ctx.session.script_sent()
            self._run(run, ticket)

    def track(
        self,
        call: TrackCall,
        *,
        require_balance: bool = False,
        hold: admission.Hold | None = None,
    ) -> str:
        """``track()`` through the admit script: with ``require_balance``, only when every meter
        the event counts in covers its value; with ``hold``, releasing it (a commit)."""
        meters: list[str] = []  # the event's meters, once known
        operation = semconv.COMMIT if hold is not None else semconv.TRACK
        external_customer_id, customer_id = call.external_customer_id, call.customer_id
        with self._recorded(operation, external_customer_id, customer_id, meters):
            self._start()
            ctx = self._context
            now_us = ctx.now_us()
            arguments = call.arguments(now_us)
            customer = customer_of(external_customer_id, customer_id)
            try:
                with ctx.lock:
                    track = ctx.session.track(**arguments)
            except NotReady:
                self._reads.wait_for_configuration()
                with ctx.lock:
                    track = ctx.session.track(**arguments)
            meters.extend(dict.fromkeys(track.meter_ids))
            if require_balance:
                for meter_id in dict.fromkeys(track.meter_ids):  # ready as a first read is
                    self._ready(meter_id, external_customer_id, customer_id)
            with ctx.lock:
                run, asks = admission.admit(
                    ctx.session,
                    track,
                    customer,
                    now_us=now_us,
                    require_balance=require_balance,
                    hold=hold,
                    one_slot=ctx.cluster is not None,
                )
                ticket = ctx.session.script_sent()
            event: str = arguments["event_id"]
            refusal = self._run(run, ticket, event)
            if refusal is not None:
                raise refusal.error(asks.get(refusal.meter_id, 0.0))
            return event

    @contextlib.contextmanager
    def _recorded(
        self,
        operation: str,
        external_customer_id: str | None,
        customer_id: str | None,
        meter_ids: list[str],
    ) -> Iterator[None]:
        """Telemetry of the admission run inside: its duration, operation and outcome, for each
        of ``meter_ids`` as they are when it ends."""
        started = time.perf_counter_ns()
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            telemetry = self._context.telemetry
            outcome = admission_outcome(error)
            if telemetry.enabled and outcome is not None:
                elapsed = time.perf_counter_ns() - started
                telemetry.recorder.admitted(
                    operation, external_customer_id, customer_id, tuple(meter_ids), elapsed, outcome
                )

    def _ready(
        self, meter_id: str, external_customer_id: str | None, customer_id: str | None
    ) -> None:
        """Wait, as a first read does, until the customer is ready for admission (at once when
        it is: no balance is computed then)."""
        ctx = self._context
        with ctx.lock:
            ready = admission.ready(ctx.session, meter_id, external_customer_id, customer_id)
        if not ready:
            self._reads.when_ready(meter_id, external_customer_id, customer_id)

    def _run(
        self, run: RunScript, ticket: int, event_id: str | None = None
    ) -> admission.Refusal | None:
        """Run an admission script as ``track()`` runs its own: its changes reach the session
        (its echo is recognised), ``durability="replica"`` waits for a replica. Returns the
        refusal the script answered, if it did (nothing written then). ``event_id``: the event
        it records, if it records one."""
        ctx = self._context
        reply, shortfall = run_echoed(ctx, self._effects, run, ticket, self._durability)
        refusal = admission.refusal_of(reply)
        self._effects.replied(None if refusal else reply, ticket)
        if refusal is None and shortfall:
            what = run.script if event_id is None else f"event {event_id} ({run.script})"
            raise NotDurable(f"{what} is on the primary only: {shortfall}", event_id)
        return refusal


def _names(customer: Customer) -> tuple[str | None, str | None]:
    """``(external_customer_id, customer_id)`` of a customer."""
    return (customer.id, None) if customer.kind == "external" else (None, customer.id)
