# GENERATED from tests/drivers/_async/test_aliases.py by scripts/unasync.py: do not edit.
"""One customer, two names (issue 13 part 5), both drivers, against the emulator and real Redis:
events tracked under ``customer_id`` on one instance and under ``external_customer_id`` on the
other are counted by every read of either name, which never reads above Polar's balance."""

from __future__ import annotations

from outpost_emulator import Emulator
from outpost_sync import Balance, Outpost
from tests.drivers._sync._concurrency import run_concurrently
from tests.drivers._sync._helpers import connect, count_meter, eventually
from tests.support.redis_server import RedisServer

EXTERNAL = "acme"


def both_names(instance: Outpost, meter: str, customer_id: str) -> list[Balance]:
    return [
        instance.balance(meter, external_customer_id=EXTERNAL),
        instance.balance(meter, customer_id=customer_id),
    ]


def test_events_tracked_under_either_name_count_in_reads_of_both(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = count_meter(emulator)
    customer_id = str(emulator.create_customer(external_id=EXTERNAL)["id"])
    emulator.grant_credits(meter, 100, customer_id=customer_id)

    def polar_balance() -> float:
        return float(emulator.customer_meter(meter, customer_id=customer_id)["balance"])

    # Nothing reaches Polar before flush(): until then its balance is 100, after it 95, so every
    # read can be held to it (another instance's copy lagging is issue 13 part 4, not this).
    a, b = (connect(redis_server, emulator, linger=60) for _ in range(2))
    with a, b:
        for instance in (a, b):
            assert [x.balance for x in both_names(instance, meter, customer_id)] == [100] * 2
        for _ in range(3):
            a.track("api_call", customer_id=customer_id)
        for _ in range(2):
            b.track("api_call", external_customer_id=EXTERNAL)

        def every_read_counts_all_five() -> bool:
            found = [x for i in (a, b) for x in both_names(i, meter, customer_id)]
            return all(x.consumed == 5 for x in found)

        # Before the fix, a read by one name counted only the events tracked under that name.
        eventually(every_read_counts_all_five, what="every read counting the 5 events")
        assert polar_balance() == 100
        flushed: list[bool] = []

        def flush(instance: Outpost) -> None:
            flushed.append(instance.flush(10))

        # Both at once: either instance's delivery may hold the other's events, lingering.
        run_concurrently([lambda: flush(a), lambda: flush(b)])
        assert flushed == [True, True]
        assert polar_balance() == 95
        for instance in (a, b):
            assert [x.balance for x in both_names(instance, meter, customer_id)] == [95] * 2
            # A read that goes to Redis reads both names' hashes (one round trip).
            fresh = instance.balance(meter, customer_id=customer_id, fresh=True)
            assert (fresh.source, fresh.balance, fresh.pending) == ("redis", 95, 5)
        seen: list[Balance] = []

        emulator.advance(6 * 60)  # the bucket syncs: Polar pushes snapshots of both names
        seen.clear()

        def snapshots_cover_every_event() -> bool:
            found = [x for i in (a, b) for x in both_names(i, meter, customer_id)]
            seen.extend(found)
            return all(x.pending == 0 and x.polar.count == 5 for x in found)

        eventually(snapshots_cover_every_event, what="snapshots counting the 5 events")
        # Meanwhile some reads over-counted (a name's events the other's newer totals counted):
        # never under, so never above Polar's balance.
        assert all(x.consumed >= 5 and x.balance <= polar_balance() for x in seen)
        for instance in (a, b):
            final = both_names(instance, meter, customer_id)
            assert [(x.consumed, x.balance) for x in final] == [(5, 95)] * 2
            assert final[0].aliases and final[1].aliases


def test_a_customer_created_for_a_followed_external_id_is_merged_from_its_push(
    redis_server: RedisServer, emulator: Emulator
) -> None:
    meter = count_meter(emulator)
    with connect(redis_server, emulator) as a, connect(redis_server, emulator) as b:
        before = a.balance(meter, external_customer_id="later")
        assert before.aliases == ()
        customer_id = str(emulator.create_customer(external_id="later")["id"])

        def alias_learned() -> bool:
            found = a.balance(meter, external_customer_id="later")
            return bool(found.aliases)

        eventually(alias_learned, what="the pushed snapshot naming the customer id")
        b.track("api_call", customer_id=customer_id)
        b.track("api_call", customer_id=customer_id)
        a.track("api_call", external_customer_id="later")

        def all_three() -> bool:
            by_external = a.balance(meter, external_customer_id="later")
            by_id = b.balance(meter, customer_id=customer_id)
            return by_external.consumed == 3 and by_id.consumed == 3

        eventually(all_three, what="both reads counting the 3 events")
