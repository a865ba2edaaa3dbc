"""The answer to ``balance()``: a meter's balance for one customer, with where it came from."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import attrs

from ._aggregate import Aggregate
from ._keys import Customer
from ._mirror import IdentityState
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
) -> Balance:
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
    )
