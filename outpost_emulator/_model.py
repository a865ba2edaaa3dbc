"""The emulator's in-memory records. Plain data; behaviour lives in the modules that use them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from outpost_emulator._timeutil import floor_bucket, iso

JsonObject = dict[str, Any]
ClauseValue = str | int | bool
Operator = Literal["eq", "ne", "gt", "gte", "lt", "lte", "like", "not_like"]
OPERATORS: tuple[Operator, ...] = ("eq", "ne", "gt", "gte", "lt", "lte", "like", "not_like")
AggregationFunc = Literal["count", "sum", "max", "min", "avg", "unique"]
AGGREGATION_FUNCS: tuple[AggregationFunc, ...] = ("count", "sum", "max", "min", "avg", "unique")

# A customer reference exactly as an event, a subscription or a credit carries it:
# ("customer_id", "<uuid>") or ("external_customer_id", "<any string>").
IdentityField = Literal["customer_id", "external_customer_id"]
Identity = tuple[IdentityField, str]


@dataclass(frozen=True, slots=True)
class Clause:
    property: str  # leading "metadata." already stripped, as Polar does
    operator: Operator
    value: ClauseValue

    def to_json(self) -> JsonObject:
        return {"property": self.property, "operator": self.operator, "value": self.value}


@dataclass(frozen=True, slots=True)
class Filter:
    conjunction: Literal["and", "or"]
    clauses: tuple[Clause | Filter, ...]

    def to_json(self) -> JsonObject:
        return {"conjunction": self.conjunction, "clauses": [c.to_json() for c in self.clauses]}


@dataclass(frozen=True, slots=True)
class Aggregation:
    func: AggregationFunc
    property: str | None = None  # None only for count

    def to_json(self) -> JsonObject:
        if self.property is None:
            return {"func": self.func}
        return {"func": self.func, "property": self.property}


@dataclass(slots=True)
class Meter:
    id: str
    name: str
    filter: Filter
    aggregation: Aggregation
    organization_id: str
    created_at_us: int
    unit: str = "scalar"
    custom_label: str | None = None
    custom_multiplier: int | None = None
    metadata: JsonObject = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        """Polar's public `Meter` schema."""
        return {
            "id": self.id,
            "created_at": iso(self.created_at_us),
            "modified_at": None,
            "name": self.name,
            "unit": self.unit,
            "custom_label": self.custom_label,
            "custom_multiplier": self.custom_multiplier,
            "filter": self.filter.to_json(),
            "aggregation": self.aggregation.to_json(),
            "organization_id": self.organization_id,
            "archived_at": None,
            "metadata": dict(self.metadata),
        }


@dataclass(slots=True)
class Reducer:
    id: str
    filter: Filter
    aggregation: Aggregation
    meter_ids: list[str]

    @property
    def reducible(self) -> bool:
        # `unique` cannot be kept as count/sum/min/max buckets: distinct counts do not add up.
        return self.aggregation.func != "unique"

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "filter": self.filter.to_json(),
            "aggregation": self.aggregation.to_json(),
            "meter_ids": list(self.meter_ids),
        }


EventStatus = Literal["current", "waiting", "counted"]


@dataclass(slots=True)
class StoredEvent:
    seq: int  # ingestion order
    name: str
    timestamp_us: int
    identity: Identity
    external_id: str | None
    metadata: JsonObject
    ingested_at_us: int
    source: str = "user"
    # "current": in Polar's Redis bucket, waiting for the close-sync; "waiting": a late event
    # held while syncs are paused; "counted": in its Postgres bucket row.
    status: EventStatus = "current"
    counted_at_us: int | None = None
    # Position in the emulator's total order of "counted" and "snapshot taken" steps. A snapshot
    # counts an event iff counted_version <= snapshot.version: the same rule as
    # counted_at <= as_of, without ties when the clock is frozen.
    counted_version: int | None = None

    @property
    def bucket_start_us(self) -> int:
        return floor_bucket(self.timestamp_us)
