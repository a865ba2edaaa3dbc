from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from outpost_emulator import Emulator
from tests.support.redis_server import RedisServer

# No per-example deadline: on a loaded machine it is a timing assertion, and fails at random.
settings.register_profile("outpost", deadline=None)
settings.load_profile("outpost")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
def durable_redis_server() -> Iterator[RedisServer]:
    server = RedisServer(durable=True)
    server.start()
    yield server
    server.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sync_backend() -> str:
    return "threads"


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    """A local Polar on a free port, its clock running from now (tests advance it)."""
    with Emulator.start(port=0, sync_delay=1.0) as emu:
        yield emu


class CertificateAuthority:
    """A certificate authority made for the test run (trustme), and a certificate it signed
    for the emulator's loopback address."""

    def __init__(self, directory: Path) -> None:
        import trustme

        self.authority = trustme.CA()
        self.bundle = str(directory / "ca.pem")  # what a caller passes as `verify`
        self.authority.cert_pem.write_to_path(self.bundle)
        server = self.authority.issue_cert("127.0.0.1", "localhost")
        self.chain = str(directory / "server.pem")
        self.key = str(directory / "server.key")
        server.private_key_and_cert_chain_pem.write_to_path(self.chain)
        server.private_key_pem.write_to_path(self.key)


@pytest.fixture(scope="session")
def authority(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def tls_emulator(authority: CertificateAuthority) -> Iterator[Emulator]:
    """The emulator over HTTPS and wss://, with a certificate from the test CA."""
    with Emulator.start(port=0, sync_delay=1.0, tls=(authority.chain, authority.key)) as emu:
        yield emu


class Otel:
    """The process's global OpenTelemetry providers, recording in memory (set once: OpenTelemetry
    allows one global provider per process)."""

    def __init__(self) -> None:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.reader = InMemoryMetricReader()
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        metrics.set_meter_provider(MeterProvider(metric_readers=[self.reader]))
        trace.set_tracer_provider(tracer_provider)

    def points(self) -> list[tuple[str, dict[str, Any], Any]]:
        """Every metric data point recorded so far: (name, attributes, point)."""
        out: list[tuple[str, dict[str, Any], Any]] = []
        data = self.reader.get_metrics_data()
        for resource_metrics in data.resource_metrics if data else []:
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        out.append((metric.name, dict(point.attributes or {}), point))
        return out


_OTEL: list[Otel] = []


@pytest.fixture
def otel() -> Otel:
    if not _OTEL:
        _OTEL.append(Otel())
    return _OTEL[0]
