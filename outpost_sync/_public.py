# GENERATED from outpost_async/_public.py by scripts/unasync.py: do not edit.
"""The public-API mode: Polar followed through its public API (``docs/public-mode.md``).

Where Polar serves no ``/v1/outpost/``, there is no WebSocket and no snapshot. Instead:

- the configuration comes from ``GET /v1/meters/`` (one reducer per meter, cached in Redis
  marked with the mode), refreshed every ``poll_interval``;
- a first read of a customer asks for its figures at once (``wanted``) and waits for the anchor
  like a first read waits for a snapshot;
- one poll loop per instance plans (the core's ``PollPlanner``) which customer meters to ask
  ``GET /v1/customer-meters/`` about, and which to probe (``GET /v1/meters/{id}/quantities``:
  a balance at or below the band, or a busy ledger under an old figure), each request taken
  from the budget every instance shares (``budget.lua``), and applies the answers
  (``_anchors.py``);
- webhooks (``handle_webhook``) apply the figures Polar pushes.

``mode="auto"`` starts like the snapshot protocol and switches to this mode when Polar answers
the WebSocket's upgrade with a 404.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from outpost_core import (
    CONFIGURATION_KEY,
    ConfigurationError,
    ConfigurationReceived,
    Customer,
    InvalidEvent,
    LinkState,
)
from outpost_core.public_mode import (
    ID_PARAMS,
    CustomerMetersRequest,
    Followed,
    Key,
    PollPlanner,
    QuantitiesProbe,
    asked_meters,
    cached_mode,
    check_mode,
    choose_mode,
    customer_of,
    customer_of_reading,
    followed_of,
    missing_rows,
    mode_conflict,
    no_row,
    parse_customer_meters,
    parse_meters_page,
    parse_quantities,
    probe_params,
    public_configuration,
    quantities_path,
    take,
    urgent_requests,
    wait_of,
)
from outpost_sync._anchors import Anchors
from outpost_sync._backend import Signal, sleep
from outpost_sync._context import POLL, DriverContext, failed_in_redis, redis_unavailable
from outpost_sync._effects import SessionEffects
from outpost_sync._scripts import take_request
from outpost_sync._supervisor import redacted

_RETRY = 1.0  # seconds before a failed request to Polar is tried again
_PLAN_EVERY = 1.0  # seconds between two looks at what is due (each walks the followed copies)


class PublicMode:
    """The mode an instance runs, and the public mode's loop."""

    def __init__(
        self,
        context: DriverContext,
        effects: SessionEffects,
        mode: str,
        margin: float,
        poll_interval: float,
        webhook_secret: str | None,
        requests_per_minute: float,
    ) -> None:
        self._context = context
        self._effects = effects
        self.requested = check_mode(mode)
        if not (margin >= 0 and poll_interval > 0):
            raise ConfigurationError("public_margin must be >= 0 and poll_interval > 0")
        self.mode = mode
        """``auto`` until Polar answered the WebSocket's upgrade, then what runs."""
        waiting = "waiting for Polar's answer on /v1/outpost/"
        self.reason = waiting if mode == "auto" else f"mode={mode!r} was asked"
        self.anchors = Anchors(context, effects, margin, webhook_secret)
        self._poll_interval = poll_interval
        self._per_minute = requests_per_minute
        share = requests_per_minute / 2 if requests_per_minute > 0 else 300.0
        self.planner = PollPlanner(per_minute=share, poll_every_s=poll_interval)
        self._urgent: dict[Customer, None] = {}
        self._wake = Signal()
        self._seen: dict[Key, int | None] = {}
        self._views: dict[Key, tuple[int, Followed]] = {}
        """What the planner last learnt of each followed copy, by the copy's revision."""
        self.last_error: str | None = None
        self.requests = 0
        """Requests sent to Polar's public API (meters, customer meters, quantities)."""
        self._sent_at_us = 0  # when the last request went out (Outpost's clock)

    # -- the mode ---------------------------------------------------------------------------

    def before_start(self) -> None:
        """A mode asked for: run without the WebSocket if public, and refuse a Redis whose
        cached configuration was built by the other mode."""
        if self.requested == "auto":
            return
        with redis_unavailable("reading the cached configuration"):
            cached = self._cached_mode()
        conflict = mode_conflict(self.requested, cached)
        if conflict is not None:
            raise ConfigurationError(conflict)
        if self.requested == "public":
            with self._context.lock:
                self._context.session.drop_link()

    def _cached_mode(self) -> str | None:
        text = self._context.redis.get(CONFIGURATION_KEY)
        return None if text is None else cached_mode(text)

    def _decide(self) -> None:
        """Auto: wait until the WebSocket opens (the snapshot protocol) or is refused with a
        404 (the public API)."""
        ctx = self._context
        while not ctx.closed and self.mode == "auto":
            version = ctx.signal.version
            with ctx.lock:
                remote = ctx.session.remote
                link = remote.link if remote is not None else None
                status = None
                if link is not None and link.state is LinkState.OPEN:
                    status = 101
                elif link is not None and link.refused_status is not None:
                    status = link.refused_status
                if status is not None:
                    self.mode, self.reason = choose_mode("auto", status, None)
                    if self.mode == "public":
                        ctx.session.drop_link()
                        ctx.want_open, ctx.drop_stream = None, True
            if self.mode == "auto":
                ctx.signal.wait(version, POLL)
        if self.mode == "public":
            conflict = mode_conflict("public", self._cached_mode())
            if conflict is not None:
                ctx.log.error("outpost: %s", conflict)
                self.reason += f"; {conflict}"

    # -- reads waiting for an anchor --------------------------------------------------------

    def wanted(self, external_customer_id: str | None, customer_id: str | None) -> None:
        """A read waits for this customer's anchor: ask Polar at once (by the name the read
        gave: the external id, or Polar's customer id)."""
        if self.mode == "snapshots":
            return
        try:
            customer = customer_of(external_customer_id, customer_id)
        except InvalidEvent:
            return  # (the read says so itself)
        if customer not in self._urgent:
            with self._context.lock:  # (the sync driver's readers are threads)
                self._urgent[customer] = None
            self._wake.fire()

    def handle_webhook(self, body: bytes, headers: Any) -> int:
        """A delivery of Polar's webhooks: verified whatever the mode; its figures applied in
        the public mode only (the snapshot protocol has its own; undecided yet: deliver later)."""
        return self.anchors.handle_webhook(
            body, headers, apply={"public": True, "snapshots": False}.get(self.mode)
        )

    def not_ready_reason(self, customer: str) -> str:
        error = f" (last error: {self.last_error})" if self.last_error else ""
        return f"Polar's customer meters of {customer} not read yet{error}"

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        ctx = self._context
        if self.mode == "auto":
            self._decide()
        if self.mode != "public" or ctx.http is None:
            return  # the snapshot protocol, or no token to ask Polar with
        refresh_at = 0.0
        while not ctx.closed:
            version = self._wake.version
            try:
                if time.monotonic() >= refresh_at:
                    done = self.configure()
                    refresh_at = time.monotonic() + (self._poll_interval if done else _RETRY)
                if self._urgent:
                    self._poll_urgent()
                polls, probes = self._plan()
                for request in polls:
                    self._poll(request, {})
                for probe in probes:
                    self._probe(probe)
            except Exception as exc:
                if not failed_in_redis(exc):
                    raise  # a bug: the supervisor logs it with its traceback and restarts
                error = redacted(str(exc), self._context.access_token)
                self._failed(error, "Redis")  # an outage: said once, retried
                sleep(_RETRY)
            self._wake.wait(version, _PLAN_EVERY)  # a read waiting wakes it at once

    def configure(self) -> bool:
        """Read every page of ``GET /v1/meters/`` and hand the session the configuration."""
        meters: list[Any] = []
        page, max_page = 1, 1
        while page <= max_page:
            body = self._get("/v1/meters/", {"page": str(page), "limit": "100"})
            if body is None:
                return False
            parsed = parse_meters_page(body)
            for problem in parsed.problems:
                with self._context.lock:
                    self._context.session.reject("configuration", problem)
            meters += parsed.meters
            page, max_page = page + 1, parsed.max_page
        self._effects.feed(ConfigurationReceived(public_configuration(meters)))
        return True

    def _followed_meters(self, kind: str) -> dict[str, list[str]]:
        """Customer (named as ``kind`` names it) → the meters this instance keeps a copy of."""
        out: dict[str, list[str]] = {}
        with self._context.lock:
            for mirror in self._context.session.followed:
                if mirror.customer.kind == kind:
                    out.setdefault(mirror.customer.id, []).append(mirror.reducer_id)
        return out

    def _plan(self) -> tuple[tuple[CustomerMetersRequest, ...], tuple[QuantitiesProbe, ...]]:
        """What the planner says is due; what an instance (any) anchored counts as heard."""
        now = self._context.now_us()  # Outpost's clock: a probe's window is on it
        seen: dict[Key, int | None] = {}
        with self._context.lock:
            configuration = self._context.session.configuration
            mirrors = [
                (m.customer, m.reducer_id, m.rev, m.state, m.fields.get("pub"))
                for m in self._context.session.followed
                if m.customer not in self._urgent
            ]  # (an urgent one is asked for by the next turn, all meters at once)
        views, self._views = self._views, {}
        for customer, meter_id, rev, state, pub in mirrors:
            key = (customer.kind, customer.id, meter_id)
            self.planner.follow(customer.id, meter_id, now, customer.kind)
            as_of = state.as_of if state.snapshot_id == "public" else None
            seen[key] = as_of
            if as_of is not None and self._seen.get(key, -1) != as_of:
                self.planner.heard(customer.id, meter_id, now, customer.kind)
            view = views.get(key)
            if view is None or view[0] != rev:  # derived again only when the copy moved
                reducer = configuration.reducer_for(meter_id) if configuration else None
                func = reducer.aggregation.func if reducer is not None else ""
                found = followed_of(customer.id, meter_id, func, state, pub, customer.kind)
                view = (rev, found)
            self._views[key] = view
        for kind, customer_id, meter_id in self._seen.keys() - seen.keys():
            self.planner.unfollow(customer_id, meter_id, kind)
        self._seen = seen
        plan = self.planner.plan(now, [view for _, view in self._views.values()])
        return plan.polls, plan.probes

    def _poll_urgent(self) -> None:
        with self._context.lock:
            urgent, self._urgent = list(self._urgent), {}
            configuration = self._context.session.configuration
        meters = len(configuration.meter_reducers) if configuration else 1
        now = self._context.now_us()  # Outpost's clock: a probe's window is on it
        for kind in ID_PARAMS:
            customers = [c.id for c in urgent if c.kind == kind]
            followed = self._followed_meters(kind) if customers else {}
            for request in urgent_requests(customers, meters, kind):
                asked = asked_meters(request, followed)
                for customer, meter_ids in asked.items():
                    for meter_id in meter_ids:  # asked now: not planned again for a while
                        self.planner.asked(customer, meter_id, now, kind)
                self._poll(request, asked)

    def _poll(self, request: CustomerMetersRequest, asked: dict[str, list[str]]) -> None:
        """One customer-meters request; its figures applied, and those asked for that Polar
        has no row for read as nothing credited, nothing consumed."""
        kind = request.kind
        if not asked:
            asked = asked_meters(request, self._followed_meters(kind))
        body = self._get("/v1/customer-meters/", list(request.params()))
        if body is None:
            with self._context.lock:  # asked again at the next turn
                for customer in request.customers:
                    self._urgent.setdefault(Customer(kind, customer), None)
            return
        readings, rejected = parse_customer_meters(body)
        for problem in rejected:
            with self._context.lock:
                self._context.session.reject("public", problem.reason)
        wanted = {(c, m) for c, meters in asked.items() for m in meters}
        for reading in readings:
            named = customer_of_reading(reading, kind)
            if named is not None and (named, reading.meter_id) in wanted:
                self.anchors.apply(Customer(kind, named), reading)
        for customer, meter_id in missing_rows(asked, readings, kind):
            ext, cid = (customer, None) if kind == "external" else (None, customer)
            reading = no_row(ext, cid, meter_id)
            self.anchors.apply(Customer(kind, customer), reading)

    def _probe(self, probe: QuantitiesProbe) -> None:
        """One quantities request: Polar's consumed over the customer meter's window, as of
        when it was sent, re-anchors its consumed (the core decides what it proves)."""
        path = quantities_path(probe.meter_id)
        body = self._get(path, list(probe_params(probe)))
        if body is None:
            return  # planned again once due
        answer = parse_quantities(body)
        if answer.total is None:
            with self._context.lock:
                self._context.session.reject("public", str(answer.problem))
            return
        customer = Customer(probe.kind, probe.customer)
        self.anchors.apply_probe(customer, probe.meter_id, answer.total, self._sent_at_us)

    def _get(self, path: str, params: Any) -> bytes | None:
        """A GET to Polar's API, its request taken from the shared budget first; ``None`` when
        it failed (logged once per cause, and retried by the caller)."""
        ctx = self._context
        http = ctx.http
        assert http is not None
        if self._per_minute > 0:
            wait = wait_of(take_request(ctx, take(self._per_minute)))
            if wait:
                sleep(wait)
        self.requests += 1
        self._sent_at_us = ctx.now_us()
        try:
            response = http.get(path, params=params)
        except httpx.HTTPError as exc:
            self._failed(f"{path}: {type(exc).__name__}")
            sleep(_RETRY)
            return None
        if response.status_code != 200:
            self._failed(f"{path}: HTTP {response.status_code}")
            sleep(_RETRY)
            return None
        self.last_error = None
        return response.content

    def _failed(self, error: str, source: str = "Polar's public API") -> None:
        """Say a failure once per cause (``source``: what failed), and keep it for the status."""
        if error != self.last_error:
            log = self._context.log
            log.warning(
                "outpost: the public mode's poll loop: %s failed (retried): %s", source, error
            )
        self.last_error = error
