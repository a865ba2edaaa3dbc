"""Telemetry: the records the README's ``telemetry`` setting names, for both drivers."""

from __future__ import annotations

import base64
import json
import threading
import uuid
from typing import Any

import pytest

import outpost_core
from outpost_async import AsyncOutpost, InvalidEvent
from outpost_core import semconv
from outpost_emulator import Emulator
from tests.conftest import Otel
from tests.drivers._async._helpers import connect, count_meter, eventually, holds, metered
from tests.support.redis_server import RedisServer, free_port
from tests.support.relay import relayed_customers

SECRET = "s3cr3t-metadata-value"
# Telemetry on, its records handed to the application's OpenTelemetry providers too.
OTEL: dict[str, Any] = {"telemetry": True, "telemetry_to_app": True}


def unique(name: str) -> str:
    """The global providers outlive a test: each test names its own customers."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def customer() -> str:
    """A customer named for this test alone (see ``unique``)."""
    return unique("tele")


def customer_points(otel: Otel, customer: str) -> dict[str, list[dict[str, object]]]:
    found: dict[str, list[dict[str, object]]] = {}
    for name, attributes, _ in otel.points():
        if attributes.get(semconv.CUSTOMER) == customer:
            found.setdefault(name, []).append(attributes)
    return found


def spans_of(otel: Otel, name: str, customer: str | None = None) -> list[dict[str, object]]:
    return [
        dict(span.attributes or {})
        for span in otel.spans.get_finished_spans()
        if span.name == name
        and (customer is None or (span.attributes or {}).get(semconv.CUSTOMER) == customer)
    ]


async def _work(instance: AsyncOutpost, meter: str, customer: str) -> None:
    await instance.balance(meter, external_customer_id=customer)  # cold
    await instance.balance(meter, external_customer_id=customer)  # warm
    await instance.track("api_call", external_customer_id=customer, metadata={"note": SECRET})
    with pytest.raises(InvalidEvent):
        await instance.track("", external_customer_id=customer)


@pytest.mark.anyio
async def test_each_record_has_its_name_attributes_and_outcome(
    redis_server: RedisServer, emulator: Emulator, otel: Otel, customer: str
) -> None:
    async with metered(redis_server, emulator, credits=5, customer=customer, **OTEL) as (meter, a):
        await _work(a, meter, customer)
        emulator.grant_credits(meter, 5, external_customer_id=customer)

        async def recorded() -> bool:
            points = customer_points(otel, f"external:{customer}")
            outcomes = {p[semconv.OUTCOME] for p in points.get(semconv.READ_DURATION, [])}
            tracked = {p[semconv.OUTCOME] for p in points.get(semconv.INGEST_DURATION, [])}
            return (
                semconv.COLD in outcomes
                and semconv.READ_WARM in points  # warm reads are counted, not timed
                and {semconv.OK, semconv.INVALID} <= tracked
                and semconv.BUCKETS_WRITTEN in points
                and len(spans_of(otel, semconv.SPAN_SNAPSHOT, f"external:{customer}")) >= 2
            )

        await eventually(recorded, what="every record of the work")
        points = customer_points(otel, f"external:{customer}")
        reads = points[semconv.READ_DURATION] + points[semconv.READ_WARM]
        assert all(p[semconv.METER] == meter for p in reads)
        assert semconv.WARM not in {p[semconv.OUTCOME] for p in points[semconv.READ_DURATION]}
        ok = [p for p in points[semconv.INGEST_DURATION] if p[semconv.OUTCOME] == semconv.OK]
        assert ok and all(p[semconv.METER] == meter for p in ok)
        # Durations in seconds, in buckets of 0.1 ms to 1 s (not OpenTelemetry's 0-5-10-...).
        durations = (semconv.INGEST_DURATION, semconv.READ_DURATION)
        for name, attributes, point in otel.points():
            if name in durations and attributes.get(semconv.CUSTOMER) == f"external:{customer}":
                assert tuple(point.explicit_bounds) == semconv.DURATION_BOUNDARIES
        snapshot = spans_of(otel, semconv.SPAN_SNAPSHOT, f"external:{customer}")[-1]
        assert list(snapshot[semconv.METERS]) == [meter]  # type: ignore[call-overload]
        assert snapshot[semconv.SNAPSHOT_ID]
        assert spans_of(otel, semconv.SPAN_CONNECTION) or a.connected
    # Closing ends the connection span and reports the syncs.
    assert spans_of(otel, semconv.SPAN_CONNECTION)
    assert spans_of(otel, semconv.SPAN_SYNCS)


@pytest.mark.anyio
async def test_admissions_are_recorded_with_their_operation_and_outcome(
    redis_server: RedisServer, emulator: Emulator, otel: Otel, customer: str
) -> None:
    async with metered(redis_server, emulator, credits=2, customer=customer, **OTEL) as (meter, a):
        async with await a.reserve(meter, 1, external_customer_id=customer):
            pass  # released on exit
        reservation = await a.reserve(meter, 1, external_customer_id=customer)
        await reservation.commit("api_call")
        await a.track("api_call", external_customer_id=customer, require_balance=True)
        with pytest.raises(outpost_core.InsufficientBalance):
            await a.reserve(meter, 1, external_customer_id=customer)
        with pytest.raises(outpost_core.InsufficientBalance):
            await a.track("api_call", external_customer_id=customer, require_balance=True)
        expected = {
            (semconv.RESERVE, semconv.OK),
            (semconv.RELEASE, semconv.OK),
            (semconv.COMMIT, semconv.OK),
            (semconv.TRACK, semconv.OK),
            (semconv.RESERVE, semconv.INSUFFICIENT_BALANCE),
            (semconv.TRACK, semconv.INSUFFICIENT_BALANCE),
        }

        def seen() -> set[tuple[object, object]]:
            points = customer_points(otel, f"external:{customer}")
            return {
                (p[semconv.OPERATION], p[semconv.OUTCOME])
                for p in points.get(semconv.ADMISSION_DURATION, [])
            }

        await eventually(holds(lambda: expected <= seen()), what="every admission recorded")
        points = customer_points(otel, f"external:{customer}")[semconv.ADMISSION_DURATION]
        assert {p[semconv.METER] for p in points} == {meter}
        assert seen() == expected


@pytest.mark.anyio
async def test_telemetry_is_recorded_off_the_subscriber_and_the_event_loop(
    redis_server: RedisServer, emulator: Emulator, otel: Otel, customer: str
) -> None:
    """Recording a second's tracks takes milliseconds (about 8 µs each), and starting the
    relay's exporters longer: done by the subscriber (or on the event loop), the changes it was
    to apply waited meanwhile."""
    async with metered(redis_server, emulator, credits=5, customer=customer, **OTEL) as (meter, a):
        threads: list[str] = []
        flush = a._context.telemetry.flush

        def noting_the_thread(*args: Any, **kwargs: Any) -> None:
            threads.append(threading.current_thread().name)
            flush(*args, **kwargs)

        a._context.telemetry.flush = noting_the_thread  # type: ignore[method-assign]
        await _work(a, meter, customer)
        await eventually(holds(lambda: len(threads) >= 2), what="two flushes")
        flushed_on = set(threads)  # close() flushes last, on the caller's thread
    assert flushed_on
    assert not flushed_on & {"outpost-subscriber", threading.main_thread().name}


@pytest.mark.anyio
async def test_a_reconnection_is_a_span(
    redis_server: RedisServer, emulator: Emulator, otel: Otel, customer: str
) -> None:
    async with metered(redis_server, emulator, **OTEL) as (meter, a):
        await a.balance(meter, external_customer_id=customer)
        before = len(spans_of(otel, semconv.SPAN_RECONNECTION))
        emulator.fault_drop_websockets()

        async def reconnected() -> bool:
            return len(spans_of(otel, semconv.SPAN_RECONNECTION)) > before and a.connected

        await eventually(reconnected, what="a reconnection span")


@pytest.mark.anyio
async def test_metadata_and_token_never_appear(
    redis_server: RedisServer, emulator: Emulator, otel: Otel, customer: str
) -> None:
    meter = count_meter(emulator)
    async with connect(redis_server, emulator, telemetry_interval=0.3, **OTEL) as a:
        await _work(a, meter, customer)

        async def exported() -> bool:
            return bool(emulator.telemetry()["metrics"]) and bool(
                customer_points(otel, f"external:{customer}")
            )

        await eventually(exported, what="records to look through")
    everything = json.dumps(
        [(n, a) for n, a, _ in otel.points()]
        + [dict(s.attributes or {}) for s in otel.spans.get_finished_spans()],
        default=str,
    )
    relayed = b"".join(
        base64.b64decode(str(item["body_base64"]))
        for signal in ("metrics", "traces")
        for item in emulator.telemetry()[signal]
    )
    for text in (everything.encode(), relayed):
        assert SECRET.encode() not in text
        assert emulator.token.encode() not in text


@pytest.mark.anyio
async def test_the_exporter_reaches_the_relay_tagged_with_organization_and_version(
    redis_server: RedisServer, emulator: Emulator, otel: Otel, customer: str
) -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

    meter = count_meter(emulator)
    organization = emulator.state()["organization_id"]
    async with connect(redis_server, emulator, telemetry=True, telemetry_interval=0.3) as a:
        await _work(a, meter, customer)

        async def relayed() -> bool:
            return bool(emulator.telemetry()["metrics"])

        await eventually(relayed, what="an export reaching the relay")
    names: set[str] = set()
    tags: set[tuple[str, str]] = set()
    temporalities: set[int] = set()
    for item in emulator.telemetry()["metrics"]:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(base64.b64decode(str(item["body_base64"])))
        for resource_metrics in request.resource_metrics:
            for attribute in resource_metrics.resource.attributes:
                tags.add((attribute.key, attribute.value.string_value))
            for scope in resource_metrics.scope_metrics:
                names.update(metric.name for metric in scope.metrics)
                temporalities.update(
                    getattr(m, m.WhichOneof("data")).aggregation_temporality for m in scope.metrics
                )
    assert (semconv.ORGANIZATION, organization) in tags
    assert (semconv.SDK_VERSION, outpost_core.__version__) in tags
    assert {semconv.READ_DURATION, semconv.INGEST_DURATION} <= names
    # Delta: an export carries its interval's series (a customer's, while it was active).
    assert temporalities == {AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA}
    named = set().union(
        *(e.get(semconv.INGEST_DURATION, set()) for e in relayed_customers(emulator))
    )
    assert f"external:{customer}" in named


@pytest.mark.anyio
async def test_close_exports_the_interval_under_way(
    redis_server: RedisServer, emulator: Emulator, customer: str
) -> None:
    """The exports follow the drains (no timer of their own): the interval a close interrupts
    goes out with the close."""
    meter = count_meter(emulator)
    async with connect(redis_server, emulator, telemetry=True, telemetry_interval=3600) as a:
        await eventually(
            holds(lambda: a._context.telemetry.exporting), what="the exporters started"
        )
        await _work(a, meter, customer)
    exports = relayed_customers(emulator)
    named = set().union(*(e.get(semconv.INGEST_DURATION, set()) for e in exports))
    assert f"external:{customer}" in named


@pytest.mark.anyio
async def test_the_application_gets_outpost_s_records_only_when_it_asks(
    redis_server: RedisServer, emulator: Emulator, otel: Otel, customer: str
) -> None:
    """The records name customers (often emails): they go to Outpost's own providers, for the
    relay; the application's global providers get them with ``telemetry_to_app=True`` only
    (the other tests here ask)."""
    meter = count_meter(emulator)
    async with connect(redis_server, emulator, telemetry=True, telemetry_interval=0.3) as a:
        await _work(a, meter, customer)

        async def relayed() -> bool:
            exports = relayed_customers(emulator)
            named = set().union(*(e.get(semconv.INGEST_DURATION, set()) for e in exports))
            return f"external:{customer}" in named

        await eventually(relayed, what="the customer's records at the relay")
    assert customer_points(otel, f"external:{customer}") == {}
    assert spans_of(otel, semconv.SPAN_SNAPSHOT, f"external:{customer}") == []


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["argument", "environment"])
async def test_telemetry_off_records_and_sends_nothing(
    redis_server: RedisServer,
    emulator: Emulator,
    otel: Otel,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    meter = count_meter(emulator)
    customer = unique(f"tele-off-{how}")
    if how == "environment":
        monkeypatch.setenv("POLAR_OUTPOST_TELEMETRY", "0")
    enabled = how == "environment"  # the variable beats the argument
    async with connect(
        redis_server, emulator, telemetry=enabled, telemetry_interval=0.2, telemetry_to_app=True
    ) as a:
        await _work(a, meter, customer)
        emulator.grant_credits(meter, 1, external_customer_id=customer)

        async def applied() -> bool:
            return (await a.balance(meter, external_customer_id=customer)).credited == 1

        await eventually(applied, what="the pushed snapshot")
    assert customer_points(otel, f"external:{customer}") == {}
    assert spans_of(otel, semconv.SPAN_SNAPSHOT, f"external:{customer}") == []
    assert emulator.telemetry() == {"metrics": [], "traces": []}


@pytest.mark.anyio
async def test_a_relay_that_is_down_changes_nothing_for_the_caller(
    redis_server: RedisServer, emulator: Emulator, otel: Otel, customer: str
) -> None:
    meter = count_meter(emulator, credits=3, customer=customer)
    dead = f"http://127.0.0.1:{free_port()}"
    async with connect(
        redis_server, emulator, telemetry=True, telemetry_url=dead, telemetry_interval=0.2
    ) as a:
        for _ in range(3):
            await a.track("api_call", external_customer_id=customer)
        b = await a.balance(meter, external_customer_id=customer)
        assert (b.consumed, b.balance) == (3, 0)
        assert await a.flush(10)
