"""The answer to ``balance()``: a meter's balance for one customer, with where it came from."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import attrs

from ._aggregate import Aggregate
from ._keys import Customer
from ._mirror import IdentityState
from ._public_anchoring import PUBLIC_SID
from ._public_ledger import RELAYED
from ._time import from_us


@attrs.frozen(slots=True)
class Balance:
    meter_id: str
    customer: Customer
    aggregation: str
    balance: float
    """``credited - consumed``."""
    credited: float
    """Credited units of the meter, from Polar's latest snapshot."""
    consumed: float
    """Polar's totals before ``cold_until`` combined with every event Polar has not counted yet."""
    polar: Aggregate
    """Polar's own totals, every event before ``cold_until``."""
    local: Aggregate
    """The events Polar has not counted yet, as tracked into this Redis."""
    pending: int
    """How many tracked events Polar has not counted yet."""
    undelivered: int
    """How many of those Polar has not acknowledged yet."""
    cold_until: datetime | None
    snapshot_as_of: datetime | None
    snapshot_id: str | None
    """The last snapshot applied to this customer's state, by any instance."""
    revision: int
    source: str = "memory"
    """Where the answer came from: ``"memory"`` (a copy following Redis, no network call) or
    ``"redis"`` (one read of the hash: the copy was not following, or ``fresh=True``)."""
    aliases: tuple[Customer, ...] = ()
    """The customer's other names (Polar's aliases) whose pending events this balance counts
    too; ``polar``, ``local``, ``pending`` and ``undelivered`` then cover every name."""
    held: float = 0.0
    """Units held by open reservations (of every instance, under every name of the customer)
    that have not expired: admitted usage not recorded yet. ``balance`` does not subtract them."""
    approximate: bool = False
    """True for an ``avg`` or ``min`` meter in the public-API mode: Polar's figure relayed as it
    is, with no bound from local events (an average is not monotone; a minimum over an empty
    window reads 0), so neither promise of ``docs/public-mode.md`` holds for it."""

    @property
    def available(self) -> float:
        """``balance - held``: what a reservation or ``track(require_balance=True)`` may take."""
        return self.balance - self.held


def merged_state(own: IdentityState, others: Sequence[IdentityState]) -> IdentityState:
    """One customer under several names (docs/invariant.md, "One customer, two names").

    Polar's totals and credits come from whichever state holds the newest applied snapshot, by
    (cold_until, as_of); the pending events of every state count. An event a name's snapshot
    counts left that name's pending, and the newest snapshot counts it too; an event no applied
    snapshot counts is still pending under its name. So none is missed; an event of an older
    state that the newest snapshot already counts is counted twice (the safe side) until that
    state applies a snapshot as new. A state without a snapshot adds its pending events only.
    """
    if not others:
        return own
    newest, local = own, own.local
    for other in others:
        local = local.merge(other.local)
        if other.cold_until is not None and _age(other) > _age(newest):
            newest = other
    return IdentityState(
        revision=own.revision,
        cold_until=newest.cold_until,
        as_of=newest.as_of,
        snapshot_id=newest.snapshot_id,
        polar=newest.polar,
        local=local,
        credits=newest.credits,
        pending=own.pending + sum(other.pending for other in others),
        undelivered=own.undelivered + sum(other.undelivered for other in others),
        problems=own.problems + tuple(p for other in others for p in other.problems),
        holds=own.holds + tuple(h for other in others for h in other.holds),
    )


def _age(state: IdentityState) -> tuple[int, int]:
    """How new a state's snapshot is (the order ``apply_snapshot`` keeps)."""
    return (state.cold_until or 0, state.as_of or 0)


def compute_balance(
    meter_id: str,
    customer: Customer,
    aggregation: str,
    state: IdentityState,
    aliases: tuple[Customer, ...] = (),
    source: str = "memory",
    now_us: int = 0,
) -> Balance:
    """The balance of ``state``; holds count while their expiry is after ``now_us``."""
    consumed = state.polar.merge(state.local).quantity(aggregation)
    credited = state.credits.get(meter_id, 0.0)
    return Balance(
        meter_id=meter_id,
        customer=customer,
        aggregation=aggregation,
        balance=credited - consumed,
        credited=credited,
        consumed=consumed,
        polar=state.polar,
        local=state.local,
        pending=state.pending,
        undelivered=state.undelivered,
        cold_until=None if state.cold_until is None else from_us(state.cold_until),
        snapshot_as_of=None if state.as_of is None else from_us(state.as_of),
        snapshot_id=state.snapshot_id,
        revision=state.revision,
        aliases=aliases,
        source=source,
        held=held_at(state, now_us),
        approximate=aggregation in RELAYED and state.snapshot_id == PUBLIC_SID,
    )


def held_at(state: IdentityState, now_us: int) -> float:
    """The units the state's holds keep from the balance at ``now_us`` (µs)."""
    return sum((units for units, expires in state.holds if expires > now_us), 0.0)


def hold_expiry(state: IdentityState, now_us: int) -> int | None:
    """When the first of the state's holds still counted at ``now_us`` expires."""
    return min((expires for _, expires in state.holds if expires > now_us), default=None)
