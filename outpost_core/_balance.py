"""The answer to ``balance()``: a meter's balance for one customer, with where it came from."""

from __future__ import annotations

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


def compute_balance(
    meter_id: str, customer: Customer, aggregation: str, state: IdentityState
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
    )
