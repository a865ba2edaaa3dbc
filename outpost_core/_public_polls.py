"""Which customer meters to ask Polar about, and when, within a request budget.

Webhooks cost nothing; polls and probes spend the organization's shared requests a minute. The
planner keeps, per followed customer meter, when Polar last reported it (by webhook or poll)
and when it was last probed, and each :meth:`PollPlanner.plan` returns what is due, paced by a
token bucket of ``per_minute`` requests (at most a fifteenth of a minute's worth at once):

1. customer meters never reported (a read needs an anchor), oldest-followed first;
2. quantities probes (count and sum meters): a customer meter whose local balance is at or below
   ``probe_band``, or whose last report is older than ``probe_after_s`` (10 minutes) while its
   ledger holds events, at most once per ``probe_every_s``;
3. customer meters last reported more than ``poll_every_s`` ago, stalest first.

``GET /v1/customer-meters/`` answers at most 100 rows, and filters by customer ids times meter
ids: a request carries up to ``100 // meters`` customers, so its rows never exceed 100.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from ._keys import CustomerKind
from .errors import UsageError

MAX_ROWS = 100
SECOND_US = 1_000_000
DAY_US = 86_400 * SECOND_US
PROBE_SPAN_US = 30 * DAY_US
"""A probe with no known window start looks back 30 days."""
_INTERVALS = ((7 * DAY_US, "hour"), (366 * DAY_US, "day"), (1460 * DAY_US, "month"))
"""The finest interval Polar serves over a span (its buckets start at the window's start
truncated to one: the finer, the less of an earlier window they take in)."""


def interval_for(span_us: int) -> str:
    return next((name for most, name in _INTERVALS if span_us <= most), "year")


ID_PARAMS: dict[CustomerKind, str] = {"external": "external_customer_id", "customer": "customer_id"}
"""The query parameter that names a customer of each kind: by the merchant's external id, or
by Polar's customer id."""
Key = tuple[CustomerKind, str, str]
"""(kind, customer, meter id): a followed customer meter."""


@attrs.frozen(slots=True)
class CustomerMetersRequest:
    """One ``GET /v1/customer-meters/``: customers of one kind (Polar ANDs its filters)."""

    external_customer_ids: tuple[str, ...]
    meter_ids: tuple[str, ...]
    customer_ids: tuple[str, ...] = ()
    """Customers named by Polar's customer id (then ``external_customer_ids`` is empty)."""

    @property
    def kind(self) -> CustomerKind:
        return "customer" if self.customer_ids else "external"

    @property
    def customers(self) -> tuple[str, ...]:
        return self.customer_ids or self.external_customer_ids

    def params(self) -> tuple[tuple[str, str], ...]:
        pairs = [(ID_PARAMS[self.kind], c) for c in self.customers]
        pairs += [("meter_id", m) for m in self.meter_ids]
        return (*pairs, ("limit", str(MAX_ROWS)))


def request_for(
    kind: str, customers: tuple[str, ...], meters: tuple[str, ...]
) -> CustomerMetersRequest:
    if kind == "customer":
        return CustomerMetersRequest((), meters, customers)
    return CustomerMetersRequest(customers, meters)


@attrs.frozen(slots=True)
class QuantitiesProbe:
    customer: str
    meter_id: str
    start_us: int
    end_us: int
    interval: str = "day"
    kind: CustomerKind = "external"


@attrs.frozen(slots=True)
class Followed:
    """What the planner needs to know of one followed customer meter, from its ledger."""

    customer: str
    meter_id: str
    aggregation: str
    balance: float | None
    pending_events: int
    window_start_us: int | None = None
    kind: CustomerKind = "external"
    """``external`` (the merchant's id) or ``customer`` (Polar's customer id)."""

    @property
    def key(self) -> Key:
        return (self.kind, self.customer, self.meter_id)


@attrs.frozen(slots=True)
class Plan:
    polls: tuple[CustomerMetersRequest, ...]
    probes: tuple[QuantitiesProbe, ...]


@attrs.define
class PollPlanner:
    per_minute: float
    poll_every_s: float = 300.0
    probe_after_s: float = 600.0
    probe_every_s: float = 60.0
    probe_band: float = 0.0
    retry_s: float = 10.0
    """A customer meter asked about and never reported is asked again after this."""
    tokens: float = 0.0
    refilled_at_us: int | None = None
    heard_at: dict[Key, int] = attrs.Factory(dict)
    probed_at: dict[Key, int] = attrs.Factory(dict)
    asked_at: dict[Key, int] = attrs.Factory(dict)
    followed_at: dict[Key, int] = attrs.Factory(dict)

    def __attrs_post_init__(self) -> None:
        if not self.per_minute > 0:
            raise UsageError("per_minute must be > 0")
        for name in ("poll_every_s", "probe_after_s", "probe_every_s", "retry_s"):
            if not getattr(self, name) > 0:
                raise UsageError(f"{name} must be > 0")

    @property
    def capacity(self) -> float:
        return max(1.0, self.per_minute / 15)

    def follow(
        self, customer: str, meter_id: str, now_us: int, kind: CustomerKind = "external"
    ) -> None:
        self.followed_at.setdefault((kind, customer, meter_id), now_us)

    def unfollow(self, customer: str, meter_id: str, kind: CustomerKind = "external") -> None:
        for table in (self.heard_at, self.probed_at, self.asked_at, self.followed_at):
            table.pop((kind, customer, meter_id), None)

    def heard(
        self, customer: str, meter_id: str, now_us: int, kind: CustomerKind = "external"
    ) -> None:
        """Polar reported this customer meter (webhook or poll) at ``now_us`` (Outpost's clock)."""
        self.heard_at[(kind, customer, meter_id)] = now_us

    def asked(
        self, customer: str, meter_id: str, now_us: int, kind: CustomerKind = "external"
    ) -> None:
        """Polar was asked about this customer meter at ``now_us``: not due for a while."""
        self.asked_at[(kind, customer, meter_id)] = now_us

    def _refill(self, now_us: int) -> None:
        if self.refilled_at_us is None:
            self.tokens = self.capacity
        elif now_us > self.refilled_at_us:
            elapsed_s = (now_us - self.refilled_at_us) / SECOND_US
            self.tokens = min(self.capacity, self.tokens + elapsed_s * self.per_minute / 60)
        self.refilled_at_us = max(now_us, self.refilled_at_us or now_us)

    def _due(self, key: Key, now_us: int) -> bool:
        asked = self.asked_at.get(key)
        heard = self.heard_at.get(key)
        if heard is None:
            return asked is None or now_us - asked >= self.retry_s * SECOND_US
        return now_us - max(heard, asked or heard) >= self.poll_every_s * SECOND_US

    def plan(self, now_us: int, followed: Iterable[Followed]) -> Plan:
        self._refill(now_us)
        followed = [f for f in followed if f.key in self.followed_at]
        views = [f for f in followed if self._due(f.key, now_us)]
        never = sorted(
            (f for f in views if f.key not in self.heard_at), key=lambda f: self.followed_at[f.key]
        )
        stale = sorted(
            (f for f in views if f.key in self.heard_at), key=lambda f: self.heard_at[f.key]
        )
        polls = self._batches(never)
        probes = [p for f in followed if (p := self._probe(f, now_us)) is not None]
        chosen_polls = polls[: int(self.tokens)]
        self.tokens -= len(chosen_polls)
        chosen_probes = probes[: int(self.tokens)]
        self.tokens -= len(chosen_probes)
        for probe in chosen_probes:
            self.probed_at[(probe.kind, probe.customer, probe.meter_id)] = now_us
        routine = self._batches(stale)[: int(self.tokens)]
        self.tokens -= len(routine)
        for request in (*chosen_polls, *routine):
            for customer in request.customers:
                for meter_id in request.meter_ids:
                    # Asked: not due again for a while, even if the answer is lost.
                    self.asked(customer, meter_id, now_us, request.kind)
        return Plan(tuple([*chosen_polls, *routine]), tuple(chosen_probes))

    def _probe(self, view: Followed, now_us: int) -> QuantitiesProbe | None:
        key = view.key
        heard = self.heard_at.get(key)
        if view.aggregation not in ("count", "sum") or heard is None or view.balance is None:
            return None
        last = self.probed_at.get(key)
        if last is not None and now_us - last < self.probe_every_s * SECOND_US:
            return None
        near_zero = view.balance <= self.probe_band
        busy_and_old = view.pending_events > 0 and now_us - heard >= self.probe_after_s * SECOND_US
        if not (near_zero or busy_and_old):
            return None
        start = view.window_start_us
        if start is None:
            start = now_us - PROBE_SPAN_US
        end = now_us + DAY_US
        interval = interval_for(end - start)
        return QuantitiesProbe(view.customer, view.meter_id, start, end, interval, view.kind)

    @staticmethod
    def _batches(views: list[Followed]) -> list[CustomerMetersRequest]:
        """Requests for these customer meters, each within 100 rows and of one kind of customer,
        in the order of the first customer meter each asks about."""
        firsts: list[tuple[int, CustomerMetersRequest]] = []
        for kind in ID_PARAMS:
            first, customers, meters = 0, list[str](), list[str]()
            for index, view in enumerate(views):
                if view.kind != kind:
                    continue
                more_customers = (
                    customers if view.customer in customers else [*customers, view.customer]
                )
                more_meters = meters if view.meter_id in meters else [*meters, view.meter_id]
                if customers and len(more_customers) * len(more_meters) > MAX_ROWS:
                    firsts.append((first, request_for(kind, tuple(customers), tuple(meters))))
                    customers, more_customers, more_meters = [], [view.customer], [view.meter_id]
                if not customers:
                    first = index
                customers, meters = more_customers, more_meters
            if customers:
                firsts.append((first, request_for(kind, tuple(customers), tuple(meters))))
        return [request for _, request in sorted(firsts, key=lambda pair: pair[0])]
