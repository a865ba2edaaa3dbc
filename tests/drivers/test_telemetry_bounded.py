"""Telemetry stays bounded however many customers pass, and each export to the relay names every
customer active in its interval (both drivers share ``outpost_io.telemetry``: this test drives
its recorder directly, as a driver's hot paths and telemetry worker do, against the emulator's
relay; tests/drivers/_async/test_telemetry.py exports through real instances)."""

from __future__ import annotations

import fnmatch
import logging
import tracemalloc

import pytest

from outpost_core import semconv
from outpost_emulator import Emulator
from outpost_io.telemetry import Telemetry
from tests.support.relay import relayed_customers
from tests.support.waiting import wait_until

CUSTOMERS = 50_000
PER_INTERVAL = 1_000  # the default cap of series per instrument
INTERVAL = 30.0
LIMIT = 10 * 1024 * 1024
# Where Outpost's telemetry state is allocated: its own modules and OpenTelemetry's SDK (the
# emulator runs in this process too; the payloads it keeps for the test are not Outpost's).
OWN = ("*outpost_core*", "*outpost_io*", "*opentelemetry*")


def own_bytes() -> int:
    # Grouped by file first, then matched: filtering each of the snapshot's traces took seconds.
    stats = tracemalloc.take_snapshot().statistics("filename")
    return sum(
        stat.size
        for stat in stats
        if any(fnmatch.fnmatch(stat.traceback[0].filename, own) for own in OWN)
    )


@pytest.mark.slow
@pytest.mark.timeout(600)  # a hang guard: 50 exports took over 120 s beside two busy processes
def test_fifty_thousand_customers_hold_one_interval_and_each_export_names_its_own(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="outpost")
    telemetry = Telemetry(
        enabled=True, relay_url=emulator.url, token=emulator.token, export_interval=INTERVAL
    )
    telemetry.export_to_relay(str(emulator.state()["organization_id"]))
    recorder = telemetry.recorder
    now = 0.0
    telemetry.flush(now, 0, 0)  # the first interval starts
    tracemalloc.start()
    try:
        baseline = own_bytes()
        held: list[int] = []
        intervals: list[set[str]] = []
        for first in range(0, CUSTOMERS, PER_INTERVAL):
            customers = [f"user-{n}@example.com" for n in range(first, first + PER_INTERVAL)]
            for customer in customers:
                recorder.read(("meter", customer, None), 250_000, semconv.COLD)
                recorder.tracked(customer, None, ("meter",), 400_000, semconv.OK, 1)
            intervals.append({f"external:{c}" for c in customers})
            now += INTERVAL
            telemetry.flush(now, 0, 0)  # ends the interval: its export starts
            wait_until(
                lambda: len(emulator.telemetry()["metrics"]) == len(intervals),
                what=f"export {len(intervals)} at the relay",
            )
            if len(intervals) % 10 == 0:
                held.append(own_bytes() - baseline)
        # One interval over the cap: the extra customers are counted, not exported.
        over = [f"late-{n}@example.com" for n in range(PER_INTERVAL + 5)]
        for customer in over:
            recorder.read(("meter", customer, None), 250_000, semconv.COLD)
        now += INTERVAL
        telemetry.flush(now, 0, 0)
        wait_until(
            lambda: len(emulator.telemetry()["metrics"]) == len(intervals) + 1,
            what="the export of the interval over the cap",
        )
        held.append(own_bytes() - baseline)
    finally:
        tracemalloc.stop()
        telemetry.shutdown(now, 0, 0)
    assert max(held) < LIMIT, [f"{h / 1e6:.1f} MB" for h in held]
    exports = relayed_customers(emulator)
    for n, (named, active) in enumerate(zip(exports, intervals, strict=False)):
        assert named[semconv.READ_DURATION] == active, f"interval {n}"
        assert named[semconv.INGEST_DURATION] == active, f"interval {n}"
        assert named[semconv.BUCKETS_WRITTEN] == active, f"interval {n}"
        assert semconv.SERIES_LEFT_OUT not in named
    last = exports[len(intervals)]
    assert len(last[semconv.READ_DURATION]) == PER_INTERVAL
    assert last[semconv.READ_DURATION] <= {f"external:{c}" for c in over}
    assert last[semconv.SERIES_LEFT_OUT] == {"5"}
    left_out = [r for r in caplog.records if "left out" in r.getMessage()]
    assert len(left_out) == 1 and left_out[0].levelno == logging.DEBUG
