# GENERATED from outpost_async/_anchors.py by scripts/unasync.py: do not edit.
"""The public-API mode's writes: Polar's figure of a customer meter applied to the identity's
state hash (``apply_anchor.lua``), from a poll page, a webhook delivery or a quantities probe.

Applying a figure reads the state hash and the identity's pending events, lets the core decide
(``outpost_core._public_anchoring``: the prune rule), and runs the script with the revision it
read. A track, an acknowledgement or another instance's anchor that lands in between moves the
revision: the script writes nothing and the figure is read and decided again, a few times; one
lost to conflicts every time is counted, and the next poll brings it again.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping
from typing import Any

from outpost_core import (
    Customer,
    InvalidWebhook,
    RunScript,
    UsageError,
    keys,
)
from outpost_core.public_mode import (
    Anchoring,
    Outcome,
    PolarReading,
    anchor,
    parse_state_changed,
    probe_anchor,
    secret_key,
    verify,
)
from outpost_sync._context import DriverContext, redis_unavailable
from outpost_sync._effects import SessionEffects
from outpost_sync._scripts import run_or_fail

ATTEMPTS = 5
"""Reads and decisions of one figure before it is given up to conflicts (the next poll brings
it again)."""
WEBHOOK_TTL_MS = 86_400_000  # a delivery id is remembered for a day: Polar retries for less
_CONFLICT = b'{"conflict":'


def _text(fields: Mapping[Any, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in fields.items():
        try:
            out[name.decode() if isinstance(name, bytes) else str(name)] = (
                value.decode() if isinstance(value, bytes) else str(value)
            )
        except UnicodeDecodeError:
            continue  # not ours: the core never sees it, the script rebuilds around it
    return out


class Anchors:
    """Applies Polar's figures; counts what happened to them."""

    def __init__(
        self,
        context: DriverContext,
        effects: SessionEffects,
        margin: float,
        webhook_secret: str | None,
    ) -> None:
        self._context = context
        self._effects = effects
        self.margin_us = int(margin * 1_000_000)
        self._key = secret_key(webhook_secret) if webhook_secret else None  # raises if malformed
        self.outcomes: collections.Counter[str] = collections.Counter()
        """Figures applied, by outcome (``first``, ``accepted``, ``rejected``, ``reset``,
        ``stale``, ``no_watermark``; probes ``probed``, ``probe_rejected``, ``probe_unused``),
        and ``conflicts`` given up."""
        self.retries = 0
        """Figures read and decided again because the revision moved (compare-and-set)."""

    def apply(
        self, customer: Customer, reading: PolarReading, *, existing: bool = False
    ) -> Outcome | None:
        """Apply one figure to the customer's state for its meter (``None``: the meter is not
        in the configuration, the figure was lost to conflicts, or ``existing`` asked for an
        identity whose state Redis holds, and it holds none: nobody follows it)."""

        def decide(func: str, fields: Any, events: Any) -> Anchoring:
            return anchor(func, self.margin_us, fields, events, reading)

        return self._write(customer, reading.meter_id, decide, existing)

    def apply_probe(
        self, customer: Customer, meter_id: str, consumed: float, sent_at_us: int
    ) -> Outcome | None:
        """Apply a quantities answer (Polar's consumed over the window as of ``sent_at_us``,
        Outpost's clock) to the customer's state for the meter: it re-anchors consumed only."""

        def decide(func: str, fields: Any, events: Any) -> Anchoring:
            margin = self.margin_us
            return probe_anchor(func, margin, fields, events, meter_id, consumed, sent_at_us)

        return self._write(customer, meter_id, decide, True)

    def _write(
        self,
        customer: Customer,
        meter_id: str,
        decide: Callable[[str, dict[str, str], dict[str, str]], Anchoring],
        existing: bool,
    ) -> Outcome | None:
        """Read, let the core decide, and run ``apply_anchor.lua`` with the revision read."""
        ctx = self._context
        with ctx.lock:
            configuration = ctx.session.configuration
            reducer = configuration.reducer_for(meter_id) if configuration else None
        if reducer is None or not reducer.aggregation.bucketed():
            return None
        session = ctx.session
        state = keys.state_key(customer, reducer.id, session.shards)
        channel = keys.channel(session.shard_of(customer), session.channel_namespace)
        for _ in range(ATTEMPTS):
            fields, events = self._read(state)
            if existing and not fields:
                return None
            decided = decide(reducer.aggregation.func, fields, events)
            for problem in decided.problems:
                with ctx.lock:
                    ctx.session.reject("public", f"{state}: {problem}")
            if decided.write is None:
                self._count(decided.outcome.value)
                return decided.outcome
            with ctx.lock:
                known = ctx.session.known_rev(state)
            args = decided.write.args(channel, known)
            run = RunScript("apply_anchor", (state, keys.acked_key(state)), args)
            reply = run_or_fail(ctx, run)
            if isinstance(reply, bytes) and reply.startswith(_CONFLICT):
                with ctx.lock:
                    self.retries += 1
                continue  # the revision moved: read and decide again
            self._effects.replied(reply)
            self._count(decided.outcome.value)
            return decided.outcome
        self._count("conflicts")
        return None

    def _count(self, outcome: str) -> None:
        with self._context.lock:  # the poll loop and webhook handlers (threads, in sync)
            self.outcomes[outcome] += 1

    def _read(self, state: str) -> tuple[dict[str, str], dict[str, str]]:
        """The state hash and every pending event of the identity (events field → value)."""
        ctx = self._context
        with redis_unavailable(f"reading {state}"):
            fields = _text(ctx.batches.execute("HGETALL", state))
            buckets = [name[2:] for name in fields if name.startswith("a:")]
            replies = ctx.batches.execute_all(
                *(("HGETALL", keys.bucket_key(state, b)) for b in buckets)
            )
        events: dict[str, str] = {}
        for reply in replies:
            events.update(_text(reply))
        return fields, events

    # -- webhooks ---------------------------------------------------------------------------

    def handle_webhook(
        self,
        body: bytes,
        headers: Mapping[str, str] | Mapping[bytes, bytes],
        apply: bool | None = True,
    ) -> int:
        """``apply``: False in the snapshot protocol (taken, nothing applied); None while the
        mode is not known yet (503: Polar delivers it again)."""
        ctx = self._context
        if self._key is None:
            raise UsageError(
                "handle_webhook() needs the endpoint's secret: webhook_secret= or the "
                "environment variable POLAR_WEBHOOK_SECRET"
            )
        if not isinstance(body, bytes | bytearray):
            raise UsageError("handle_webhook() takes the request's body as bytes, unparsed")
        verdict = verify(self._key, headers, bytes(body), time.time())
        if not verdict.genuine:
            with ctx.lock:
                ctx.session.rejections["webhook"] += 1
            ctx.log.warning("outpost refused a webhook delivery: %s", verdict.reason)
            raise InvalidWebhook(f"webhook refused: {verdict.reason}")
        if apply is None:
            return 503
        if not apply:
            return 204
        if ctx.session.configuration is None:
            self._effects.read_cached_configuration()
            if ctx.session.configuration is None:
                return 503  # no meter known yet: Polar delivers it again later
        taken = keys.FLEET_TAG + "webhook:" + keys.encode_component(verdict.message_id)
        with redis_unavailable("taking a webhook delivery"):
            if not ctx.redis.set(taken, "1", nx=True, px=WEBHOOK_TTL_MS):
                return 204  # another instance (or this one) took it already
        readings, rejected = parse_state_changed(bytes(body))
        for problem in rejected:
            with ctx.lock:
                ctx.session.reject("webhook", problem.reason)
        try:
            for reading in readings:
                for customer in identities(reading):
                    self.apply(customer, reading, existing=True)
        except BaseException:
            # Not applied: let Polar's retry bring it again (to this instance or another).
            with redis_unavailable("giving a webhook delivery back"):
                ctx.redis.delete(taken)
            raise
        return 204


def identities(reading: PolarReading) -> list[Customer]:
    """The names a reading gives its customer: by external id, by Polar's id, or both."""
    out = []
    if reading.external_customer_id is not None:
        out.append(Customer("external", reading.external_customer_id))
    if reading.customer_id is not None:
        out.append(Customer("customer", reading.customer_id))
    return out
