"""What ``track()`` builds for an event name and customer it has built for before.

A ``track()`` without metadata counts in the same reducers, with the same values, under the same
keys, every time for one event name and customer, as long as the configuration stays the same
and no reducer reads the event's timestamp (a filter on it, or a sum of it): with no metadata,
the name decides every filter then. A plan keeps what that decides (the identity's keys, the
formatted values, the JSON of the event before its id), so a repeated call only fills in the
event's id, its time and the revisions this instance holds: building the call was a large share
of a ``track()``'s own time. Plans are per configuration object, and at most :data:`MOST` of
them are kept (all dropped when full: a new configuration or a burst of customers rebuilds them).
"""

from __future__ import annotations

from json.encoder import encode_basestring  # the C encoder's, as the session's encoder uses

from ._configuration import Configuration
from ._filters import Clause, Filter
from ._keys import bucket_key

MOST = 4096
"""Plans kept at once (a few hundred bytes each)."""

PlanKey = tuple[str, str | None, str | None]
"""(event name, external customer id, customer id) as the caller passed them."""


class TrackPlan:
    """What ``track()`` built for one name and customer. A plain class: the keys of the latest
    bucket an event fell in are kept on it, as most events of a plan fall in the same bucket."""

    __slots__ = (
        "bucket",
        "bucket_text",
        "buckets",
        "channel",
        "item_head",
        "keys",
        "meter_ids",
        "outbox",
        "pairs",
        "states",
        "states_json",
    )

    def __init__(
        self,
        *,
        outbox: str,
        channel: str,
        states: tuple[str, ...],
        values: tuple[str, ...],
        meter_ids: tuple[str, ...],
        item_head: str,
        states_json: str,
    ) -> None:
        self.outbox = outbox
        self.channel = channel
        self.states = states
        self.pairs = tuple(zip(states, values, strict=True))
        """Each identity's state key and its contribution, formatted as the script takes it."""
        self.meter_ids = meter_ids
        self.item_head = item_head
        """The event's JSON up to its id: ``{"name":…,"external_customer_id":…,"external_id":``."""
        self.states_json = states_json
        self.buckets = len(states)
        self.bucket = -1
        """The bucket of :attr:`keys` and :attr:`bucket_text` (none yet)."""
        self.keys: tuple[str, ...] = ()
        self.bucket_text = ""

    def at(self, bucket: int) -> None:
        """Make :attr:`keys` and :attr:`bucket_text` those of ``bucket``."""
        keys = [self.outbox]
        for state in self.states:
            keys += (state, bucket_key(state, bucket))
        self.keys = tuple(keys)
        self.bucket_text = str(bucket)
        self.bucket = bucket


def item(plan: TrackPlan, event_id: str, timestamp: str) -> str:
    """The event as an item of the ingestion body, byte for byte as the session's encoder
    writes it without metadata."""
    return (
        f'{plan.item_head}{encode_basestring(event_id)},"timestamp":"{timestamp}","metadata":{{}}}}'
    )


def key_of(name: object, external_customer_id: object, customer_id: object) -> PlanKey | None:
    """The key of a plan for these arguments; ``None`` when they are not plain text."""
    if type(name) is not str:
        return None
    if type(external_customer_id) is str and customer_id is None:
        return (name, external_customer_id, None)
    if external_customer_id is None and type(customer_id) is str:
        return (name, None, customer_id)
    return None


def timeless(configuration: Configuration) -> bool:
    """Whether no reducer's filter or aggregation reads the event's timestamp."""
    return not any(
        reducer.aggregation.property == "timestamp" or _reads_timestamp(reducer.filter)
        for reducer in configuration.reducers.values()
    )


def _reads_timestamp(clause: Clause | Filter) -> bool:
    if isinstance(clause, Filter):
        return any(_reads_timestamp(c) for c in clause.clauses)
    return clause.property == "timestamp"


class TrackPlans:
    """The plans of one session's configuration."""

    def __init__(self) -> None:
        self._plans: dict[PlanKey, TrackPlan] = {}
        self._configuration: Configuration | None = None
        self._timeless = False

    def get(self, key: PlanKey, configuration: Configuration) -> TrackPlan | None:
        if configuration is not self._configuration:
            self._plans.clear()
            self._configuration = configuration
            self._timeless = timeless(configuration)
        return self._plans.get(key)

    def keep(self, key: PlanKey, plan: TrackPlan) -> None:
        """Keep ``plan``, built under the configuration last passed to :meth:`get`."""
        if not self._timeless:
            return
        if len(self._plans) >= MOST:
            self._plans.clear()
        self._plans[key] = plan

    def __len__(self) -> int:
        return len(self._plans)
