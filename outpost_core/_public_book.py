"""The public-API mode's state for one process, sans I/O: the followed customer meters (each a
:class:`MeterLedger`), the poll planner, and what to do with a webhook delivery, a customer-meters
page or a quantities answer.

A driver does the I/O around it: it calls :meth:`PublicBook.record` when ``track()`` writes an
event, :meth:`acknowledged` on Polar's 2xx (with the time on its clock), :meth:`discard` when
Polar refuses events for good, :meth:`handle_webhook` with a delivery's body and headers (and
answers the returned status), :meth:`plan` on its poll tick and :meth:`handle_page` /
:meth:`handle_probe` with the answers, and reads :meth:`balance`.

Whatever a peer sends (a forged or malformed webhook, a bad page) is counted in ``rejections``
and never raised; a caller's misuse (a balance of a customer meter not followed, a webhook with
no secret configured) raises :class:`UsageError` at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import attrs

from ._public_ledger import DEFAULT_MARGIN_US, LocalBalance, MeterLedger, Outcome
from ._public_polls import Followed, Plan, PollPlanner
from ._public_readings import PolarReading, parse_customer_meters, parse_state_changed
from ._webhook_signature import secret_key, verify
from .errors import UsageError

Key = tuple[str, str]  # (customer, meter id); the customer is the external customer id


@attrs.frozen(slots=True)
class WebhookAnswer:
    status: int
    """The HTTP status to answer Polar: 204 when taken (even if nothing in it was followed), 401
    when the signature does not hold (Polar retries, which is harmless)."""
    outcomes: tuple[tuple[str, str, Outcome], ...] = ()
    reason: str = ""


@attrs.define
class PublicBook:
    planner: PollPlanner
    webhook_secret: str | None = None
    margin_us: int = DEFAULT_MARGIN_US
    ledgers: dict[Key, MeterLedger] = attrs.Factory(dict)
    rejections: Counter[str] = attrs.Factory(Counter)
    _events: dict[str, list[Key]] = attrs.Factory(dict)
    _key: bytes | None = None

    def __attrs_post_init__(self) -> None:
        if self.webhook_secret is not None:
            self._key = secret_key(self.webhook_secret)

    # Following --------------------------------------------------------------------------

    def follow(self, customer: str, meter_id: str, aggregation: str, now_us: int) -> None:
        if (customer, meter_id) not in self.ledgers:
            self.ledgers[(customer, meter_id)] = MeterLedger(aggregation, self.margin_us)
        self.planner.follow(customer, meter_id, now_us)

    def unfollow(self, customer: str, meter_id: str) -> None:
        self.ledgers.pop((customer, meter_id), None)
        self.planner.unfollow(customer, meter_id)

    def _ledger(self, customer: str, meter_id: str) -> MeterLedger:
        ledger = self.ledgers.get((customer, meter_id))
        if ledger is None:
            raise UsageError(f"customer meter ({customer!r}, {meter_id!r}) is not followed")
        return ledger

    # Outpost's events -------------------------------------------------------------------

    def record(
        self,
        customer: str,
        meter_id: str,
        event_id: str,
        value: float = 1.0,
        key: str | None = None,
    ) -> None:
        self._ledger(customer, meter_id).record(event_id, value, key)
        keys = self._events.setdefault(event_id, [])
        if (customer, meter_id) not in keys:
            keys.append((customer, meter_id))

    def acknowledged(self, event_ids: Iterable[str], at_us: int) -> None:
        for event_id in event_ids:
            for key in self._events.pop(event_id, []):
                ledger = self.ledgers.get(key)
                if ledger is not None:
                    ledger.acknowledged([event_id], at_us)

    def discard(self, event_ids: Iterable[str]) -> None:
        for event_id in event_ids:
            for key in self._events.pop(event_id, []):
                ledger = self.ledgers.get(key)
                if ledger is not None:
                    ledger.discard([event_id])

    # Polar's figures --------------------------------------------------------------------

    def handle_webhook(
        self,
        body: bytes,
        headers: Mapping[str, str] | Mapping[bytes, bytes],
        now_us: int,
    ) -> WebhookAnswer:
        if self._key is None:
            raise UsageError("handle_webhook needs the webhook secret (whsec_...) configured")
        verdict = verify(self._key, headers, body, now_us / 1e6)
        if not verdict.genuine:
            self.rejections["webhook_signature"] += 1
            return WebhookAnswer(401, reason=verdict.reason)
        readings, rejected = parse_state_changed(body)
        self.rejections["webhook_row"] += len(rejected)
        return WebhookAnswer(204, self._observe(readings, now_us))

    def handle_page(self, body: bytes, now_us: int) -> tuple[tuple[str, str, Outcome], ...]:
        """A ``GET /v1/customer-meters/`` answer."""
        readings, rejected = parse_customer_meters(body)
        self.rejections["page_row"] += len(rejected)
        return self._observe(readings, now_us)

    def handle_probe(
        self, customer: str, meter_id: str, total: object, sent_at_us: int, lag_us: int
    ) -> bool:
        """A quantities answer's ``total`` for a probe the plan asked for; whether it was used."""
        ledger = self.ledgers.get((customer, meter_id))
        if isinstance(total, bool) or not isinstance(total, int | float) or total != total:
            self.rejections["probe_total"] += 1
            return False
        if ledger is None:
            return False
        return ledger.observe_probe(float(total), sent_at_us, lag_us) is not Outcome.PROBE_UNUSED

    def _observe(
        self, readings: list[PolarReading], now_us: int
    ) -> tuple[tuple[str, str, Outcome], ...]:
        outcomes = []
        for reading in readings:
            for customer in (reading.external_customer_id, reading.customer_id):
                ledger = self.ledgers.get((customer, reading.meter_id)) if customer else None
                if ledger is not None and customer is not None:
                    outcomes.append((customer, reading.meter_id, ledger.observe(reading)))
                    self.planner.heard(customer, reading.meter_id, now_us)
                    break
        return tuple(outcomes)

    # Plans and reads --------------------------------------------------------------------

    def plan(self, now_us: int) -> Plan:
        views = []
        for (customer, meter_id), ledger in self.ledgers.items():
            local = ledger.balance()
            views.append(
                Followed(
                    customer,
                    meter_id,
                    ledger.aggregation,
                    local.balance,
                    len(ledger.entries),
                    ledger.reset_hint_us,
                )
            )
        return self.planner.plan(now_us, views)

    def balance(self, customer: str, meter_id: str) -> LocalBalance:
        return self._ledger(customer, meter_id).balance()
