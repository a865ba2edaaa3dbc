"""Polar's snapshots: parsing them, and the per-customer flow that applies them.

A snapshot is applied in four steps, one customer at a time: list the buckets of the customer's
identities (their state hashes' fields, Redis), list the pending events of the buckets before
``cold_until`` (Redis), ask Polar which of those the snapshot counts (the ``counted`` question),
then run ``apply_snapshot`` with the answer. A snapshot that arrives
while another is in progress waits; a newer one replaces a waiting older one.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from ._aggregate import Aggregate, is_count, is_number
from ._event import UUID_PATTERN, canonical_uuid
from ._keys import Customer, CustomerKind
from ._time import BUCKET_US

MAX_IDS_PER_QUESTION = 10_000


class MalformedSnapshot(ValueError):
    """A snapshot payload that does not follow docs/protocol.md."""


@attrs.frozen(slots=True)
class Snapshot:
    snapshot_id: str
    request_id: str | None
    customer: Customer
    as_of: int
    cold_until: int
    reducers: Mapping[str, Aggregate]
    credited: Mapping[str, float]
    aliases: tuple[Customer, ...] = ()
    """The customer's other reference forms (Polar's ``aliases``): events tracked under them
    are this customer's too."""

    def newer_than(self, other: Snapshot) -> bool:
        return (self.cold_until, self.as_of) > (other.cold_until, other.as_of)


def parse_snapshot(payload: object) -> Snapshot:
    if not isinstance(payload, Mapping):
        raise MalformedSnapshot("payload is not an object")
    snapshot_id, request_id = payload.get("snapshot_id"), payload.get("request_id")
    if not isinstance(snapshot_id, str) or not snapshot_id:
        raise MalformedSnapshot("snapshot_id missing")
    if request_id is not None and not isinstance(request_id, str):
        raise MalformedSnapshot("request_id is not a string")
    customer = customer_in(payload)
    as_of, cold_until = payload.get("as_of"), payload.get("cold_until")
    for name, value in (("as_of", as_of), ("cold_until", cold_until)):
        if not is_count(value):
            raise MalformedSnapshot(f"{name} is not a non-negative integer")
    assert isinstance(as_of, int) and isinstance(cold_until, int)
    if cold_until % BUCKET_US:
        raise MalformedSnapshot("cold_until is not a bucket boundary")
    raw_reducers, raw_credited = payload.get("reducers"), payload.get("credited")
    if not isinstance(raw_reducers, Mapping) or not isinstance(raw_credited, Mapping):
        raise MalformedSnapshot("reducers and credited must be objects")
    reducers: dict[str, Aggregate] = {}
    for reducer_id, obj in raw_reducers.items():
        aggregate = Aggregate.from_wire(obj)
        if aggregate is None:
            raise MalformedSnapshot(f"reducer {reducer_id!r} has no valid aggregate")
        reducers[str(reducer_id)] = aggregate
    credited: dict[str, float] = {}
    for meter_id, units in raw_credited.items():
        if not is_number(units):
            raise MalformedSnapshot(f"credited[{meter_id!r}] is not a number")
        credited[str(meter_id)] = float(units)
    aliases = aliases_in(payload.get("aliases"), customer)
    return Snapshot(
        snapshot_id=snapshot_id,
        request_id=request_id,
        customer=customer,
        as_of=as_of,
        cold_until=cold_until,
        reducers=reducers,
        credited=credited,
        aliases=aliases,
    )


_ALIAS_KINDS: Mapping[str, CustomerKind] = {
    "external_customer_id": "external",
    "customer_id": "customer",
}


def aliases_in(raw: object, customer: Customer) -> tuple[Customer, ...]:
    """The ``aliases`` object: absent is none; each key is a reference form other than the
    snapshot's own, each value a non-empty string."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise MalformedSnapshot("aliases is not an object")
    aliases: list[Customer] = []
    for field, value in raw.items():
        kind = _ALIAS_KINDS.get(field) if isinstance(field, str) else None
        if kind is None or kind == customer.kind:
            raise MalformedSnapshot(f"aliases names {field!r}, not another reference form")
        if not isinstance(value, str) or not value:
            raise MalformedSnapshot(f"aliases[{field!r}] is not a non-empty string")
        if kind == "customer":
            if not UUID_PATTERN.fullmatch(value):
                raise MalformedSnapshot(f"aliases[{field!r}] is not a customer UUID")
            value = canonical_uuid(value)  # the spelling track() and balance() key it by
        aliases.append(Customer(kind, value))
    return tuple(aliases)


def customer_in(payload: Mapping[object, object]) -> Customer:
    external, internal = payload.get("external_customer_id"), payload.get("customer_id")
    if isinstance(external, str) and internal is None:
        return Customer("external", external)
    if isinstance(internal, str) and external is None:
        return Customer("customer", internal)
    raise MalformedSnapshot("exactly one of external_customer_id and customer_id must be a string")


class Step(enum.Enum):
    IDLE = "idle"  #: nothing in progress
    BUCKETS = "listing buckets"  #: waiting for the fields of the customer's state hashes
    LISTING = "listing"  #: waiting for the pending events of the buckets before cold_until
    ASKING = "asking"  #: waiting for Polar's answers to the counted question
    APPLYING = "applying"  #: waiting for apply_snapshot


@attrs.define
class CustomerFlow:
    customer: Customer
    request_id: str | None = None
    """The snapshot request in flight (``None`` once answered, or when none was sent)."""
    requested_at: float = 0.0
    applied: bool = False
    """Whether this instance applied a snapshot of this customer since it started following it."""
    step: Step = Step.IDLE
    current: Snapshot | None = None
    waiting: Snapshot | None = None
    candidates: dict[str, list[str]] = attrs.Factory(dict)
    """Event id → ``<state key>\n<events field>`` of each identity holding it, for the pending
    events before cold_until."""
    questions: set[str] = attrs.Factory(set)
    counted: set[str] = attrs.Factory(set)
    before: dict[str, dict[str, float]] = attrs.Factory(dict)
    """Per reducer, per meter: the consumption read before the snapshot in progress."""
    since: float = 0.0
    """When the current step began: a step that waits too long is given up."""
    tag: int | None = None
    """The Redis effect (list or apply) the current step waits for."""
    retry_at: float | None = None
    """When to ask for a snapshot again after the flow failed (``None``: not waiting to)."""
    failures: int = 0
    """Failures in a row (backoff); reset when a snapshot is applied."""
    rejoined: bool = False
    """Followed again after the process let it go: reads answer from Redis before the snapshot
    asked then is applied."""
    dormant: bool = False
    """Applied, and not asked again since the link reconnected (not read recently): its next
    read asks."""
    refresh_at: float | None = None
    """When to ask for a snapshot again if this instance still holds delivered events that
    no snapshot counted (``None``: not waiting to)."""
    pushed: bool = False
    """Made by a snapshot nobody asked for (a customer this instance does not follow): it lives
    only until that snapshot is applied or given up, and never asks Polar for more."""

    def offer(self, snapshot: Snapshot) -> bool:
        """Take a snapshot; ``True`` when it should start now."""
        if self.step is Step.IDLE:
            self.current = snapshot
            return True
        if self.waiting is None or snapshot.newer_than(self.waiting):
            self.waiting = snapshot
        return False

    def reset(self) -> None:
        """The link dropped: whatever was in progress is abandoned (it is asked for again)."""
        self.step = Step.IDLE
        self.current = self.waiting = None
        self.request_id = None
        self.tag = self.retry_at = None
        self.candidates.clear()
        self.questions.clear()
        self.counted.clear()

    def finish(self) -> Snapshot | None:
        """The current snapshot is done; return the next one to start, if any."""
        self.step = Step.IDLE
        self.tag = None
        self.failures = 0
        self.candidates.clear()
        self.questions.clear()
        self.counted.clear()
        self.current, self.waiting = self.waiting, None
        return self.current
