"""Customers and the one rule that maps a customer reference to a customer.

An event (or credit, or subscription) names a customer as `customer_id` or
`external_customer_id`. `resolve` is the only place that decides which customer that is:

- `customer_id` X -> the customer X (it must exist);
- `external_customer_id` E -> the customer whose external_id is E, if one exists, else an
  implicit external-only customer E (Polar accepts events for unknown external ids).

Resolution happens when the data is read, not when it is written, so creating a customer with
external_id E later also claims the events sent earlier for E.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from outpost_emulator._model import Identity, JsonObject
from outpost_emulator._timeutil import iso

CustomerKey = tuple[Literal["customer", "external"], str]


@dataclass(slots=True)
class Customer:
    id: str
    external_id: str | None
    created_at_us: int

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "external_id": self.external_id,
            "created_at": iso(self.created_at_us),
        }


def normalize_uuid(value: str) -> str | None:
    try:
        return str(uuid.UUID(value))
    except (ValueError, AttributeError, TypeError):
        return None


class Customers:
    def __init__(self) -> None:
        self._by_id: dict[str, Customer] = {}
        self._by_external: dict[str, Customer] = {}

    def create(self, external_id: str | None, now_us: int) -> Customer:
        if external_id is not None and external_id in self._by_external:
            raise ValueError(f"A customer with external_id {external_id!r} already exists.")
        customer = Customer(str(uuid.uuid4()), external_id, now_us)
        self._by_id[customer.id] = customer
        if external_id is not None:
            self._by_external[external_id] = customer
        return customer

    def get(self, customer_id: str) -> Customer | None:
        normalized = normalize_uuid(customer_id)
        return None if normalized is None else self._by_id.get(normalized)

    def all(self) -> list[Customer]:
        return list(self._by_id.values())

    def resolve(self, identity: Identity) -> CustomerKey | None:
        """The customer an identity belongs to; None for an unknown `customer_id`."""
        kind, value = identity
        if kind == "customer_id":
            customer = self.get(value)
            return None if customer is None else ("customer", customer.id)
        owner = self._by_external.get(value)
        return ("customer", owner.id) if owner is not None else ("external", value)

    def identities(self, key: CustomerKey) -> list[Identity]:
        """Every reference form under which this customer's data may have been written."""
        kind, value = key
        if kind == "external":
            return [("external_customer_id", value)]
        found: list[Identity] = [("customer_id", value)]
        customer = self._by_id.get(value)
        if customer is not None and customer.external_id is not None:
            found.append(("external_customer_id", customer.external_id))
        return found

    def describe(self, key: CustomerKey) -> tuple[str | None, str | None]:
        """(customer_id, external_customer_id) of a customer, for Polar-shaped output."""
        kind, value = key
        if kind == "external":
            return None, value
        customer = self._by_id.get(value)
        return value, None if customer is None else customer.external_id
