"""The public mode's per-process state: webhooks, pages and probes reach the right ledgers;
peers' garbage is counted, the caller's misuse raised."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from outpost_core._public_book import PublicBook
from outpost_core._public_ledger import Outcome
from outpost_core._public_polls import PollPlanner
from outpost_core._webhook_signature import sign
from outpost_core.errors import UsageError

S = 1_000_000
NOW = 1_796_223_720 * S
KEY = b"k" * 24
SECRET = "whsec_" + base64.b64encode(KEY).decode()


def row(
    meter: str = "m1", consumed: float = 0, credited: int = 100, at: str = "2026-12-02T15:00:00Z"
) -> dict[str, Any]:
    return {"meter_id": meter, "consumed_units": consumed, "credited_units": credited,
            "balance": credited - consumed, "modified_at": at}  # fmt: skip


def delivery(
    rows: list[dict[str, Any]], external_id: str | None = "acme"
) -> tuple[bytes, dict[str, str]]:
    state = {"external_id": external_id, "id": "u1", "active_meters": rows}
    body = json.dumps({"type": "customer.state_changed", "data": state}).encode()
    at = NOW // S
    return body, {"webhook-id": "msg_1", "webhook-timestamp": str(at),
                  "webhook-signature": sign(KEY, "msg_1", at, body)}  # fmt: skip


def book() -> PublicBook:
    b = PublicBook(PollPlanner(per_minute=60), webhook_secret=SECRET)
    b.follow("acme", "m1", "count", NOW)
    b.follow("acme", "m1", "count", NOW)  # again: nothing changes
    b.follow("u2", "m1", "sum", NOW)
    return b


def test_webhook_reaches_the_ledger() -> None:
    b = book()
    b.record("acme", "m1", "e1")
    b.record("acme", "m1", "e1")
    body, headers = delivery([row(), row(meter="other")])
    answer = b.handle_webhook(body, headers, NOW)
    assert answer.status == 204
    assert answer.outcomes == (("acme", "m1", Outcome.FIRST),)
    assert b.balance("acme", "m1").balance == 99
    b.acknowledged(["e1", "unknown"], NOW)
    assert b.ledgers[("acme", "m1")].entries["e1"].acked_at_us == NOW


def test_forged_and_malformed_webhooks_are_counted() -> None:
    b = book()
    body, headers = delivery([row()])
    assert b.handle_webhook(body + b" ", headers, NOW).status == 401
    assert b.rejections["webhook_signature"] == 1
    body, headers = delivery([row(), {"meter_id": 3}])
    assert b.handle_webhook(body, headers, NOW).status == 204
    assert b.rejections["webhook_row"] == 1
    with pytest.raises(UsageError):
        PublicBook(PollPlanner(per_minute=60)).handle_webhook(body, headers, NOW)


def test_a_customer_followed_by_its_polar_id() -> None:
    b = book()
    page = json.dumps({"items": [{**row(consumed=4), "customer_id": "u2", "customer": None}]})
    assert b.handle_page(page.encode(), NOW) == (("u2", "m1", Outcome.FIRST),)
    assert b.handle_page(b"junk", NOW) == ()
    assert b.rejections["page_row"] == 1
    assert b.plan(NOW).polls[0].external_customer_ids == ("acme",)  # never reported yet


def test_probes_discards_and_unfollowing() -> None:
    b = book()
    b.handle_page(
        json.dumps({"items": [{**row(), "customer": {"external_id": "acme"}}]}).encode(), NOW
    )
    b.record("acme", "m1", "e1")
    b.record("acme", "m1", "e2")
    b.discard(["e2", "unknown"])
    assert not b.handle_probe("acme", "m1", 10, NOW + 5 * S, 0)  # more than Polar can count
    assert b.handle_probe("acme", "m1", 1, NOW + 5 * S, 0)
    # Polar's 1 can only be e1 (sent, its answer not back): it is not counted twice.
    assert b.balance("acme", "m1").balance == 99
    assert not b.handle_probe("acme", "m1", True, NOW, 0)
    assert not b.handle_probe("acme", "m1", float("nan"), NOW, 0)
    assert b.rejections["probe_total"] == 2
    assert not b.handle_probe("nobody", "m1", 1, NOW + 6 * S, 0)
    b.unfollow("acme", "m1")
    b.acknowledged(["e1"], NOW)  # a ledger no longer followed: ignored
    b.record("u2", "m1", "e3", 2.0)
    b.unfollow("u2", "m1")
    b.discard(["e3"])
    with pytest.raises(UsageError):
        b.balance("acme", "m1")
    with pytest.raises(UsageError):
        b.record("acme", "m1", "e4")
