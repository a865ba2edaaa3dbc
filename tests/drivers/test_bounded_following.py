"""A process follows a bounded number of customers, end to end: the sync driver as it is (it runs
the core's effects), against the emulator and real Redis, with ``max_customers=1``."""

from __future__ import annotations

from outpost_emulator import Emulator
from tests.drivers._sync._helpers import connect, count_meter, eventually, holds
from tests.support.redis_server import RedisServer


def test_a_customer_let_go_is_forgotten_by_polar_and_read_again_correctly(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = count_meter(emulator, credits=100, customer="c1")
    with connect(redis_server, emulator, max_customers=1) as a:
        core = a._context.session
        first = a.balance(meter, external_customer_id="c1")
        assert first.balance == 100
        a.track("api_call", external_customer_id="c1")

        def subscriptions() -> list[dict[str, str]]:
            [connection] = emulator.state()["connections"]
            return list(connection["subscriptions"])

        eventually(holds(lambda: subscriptions() == [{"external_customer_id": "c1"}]))
        a.balance(meter, external_customer_id="c2")  # c1 is let go: Polar forgets it
        eventually(
            holds(lambda: subscriptions() == [{"external_customer_id": "c2"}]),
            what="Polar forgetting c1",
        )
        assert {m.customer.id for m in core.followed} == {"c2"}
        again = a.balance(meter, external_customer_id="c1")  # from Redis, at once
        assert (again.credited, again.consumed, again.balance) == (100, 1, 99)
        eventually(
            holds(lambda: subscriptions() == [{"external_customer_id": "c1"}]),
            what="c1 asked for again, c2 let go",
        )
