from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import settings

from outpost_core import DEFAULT_SHARDS
from outpost_emulator import Emulator
from scripts.unasync import build_sync_tests
from tests.support import emulators
from tests.support.redis_cluster import RedisCluster, RedisReplica
from tests.support.redis_server import RedisServer, discard
from tests.support.webhook_receiver import Receiver

# No per-example deadline: on a loaded machine it is a timing assertion, and fails at random.
settings.register_profile("outpost", deadline=None)
settings.load_profile("outpost")


def pytest_configure(config: pytest.Config) -> None:
    # The sync driver tests are generated from tests/drivers/_async/ and not committed: build the
    # stale ones before anything is collected (a no-op when every digest matches).
    build_sync_tests()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    emulators.wait_stopped()  # the last tests' emulators, stopped behind them


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    discard(server)


@pytest.fixture
def durable_redis_server() -> Iterator[RedisServer]:
    server = RedisServer(durable=True)
    server.start()
    yield server
    discard(server)


@pytest.fixture
def redis_replica(redis_server: RedisServer) -> Iterator[RedisReplica]:
    """A replica of ``redis_server``, in sync."""
    replica = RedisReplica(redis_server)
    replica.start()
    try:
        replica.wait_in_sync()
        yield replica
    finally:
        discard(replica)


SESSION_CLUSTER = (4, 64)
"""The shared cluster's primaries, and its deployment's shard count: more primaries than the
default 16 shards could keep busy is what more shards are for."""
OWN_CLUSTERS = [(3, DEFAULT_SHARDS), SESSION_CLUSTER]
"""The clusters a test kills or reshards: the default layout and the shared cluster's."""


@pytest.fixture(scope="session")
def _session_cluster() -> Iterator[RedisCluster]:
    """One Redis Cluster (4 primaries, 4 replicas, 64 shards) for the whole run, started on first
    use. No test kills its nodes, so they may go unheard for long before a replica takes over."""
    primaries, shards = SESSION_CLUSTER
    yield from _started_cluster(node_timeout_ms=15_000, primaries=primaries, shards=shards)


@pytest.fixture
def redis_cluster(_session_cluster: RedisCluster) -> RedisCluster:
    """The shared cluster, healthy and empty (flushed before each test) but for its deployment's
    shard count."""
    _session_cluster.wait_healthy()
    _session_cluster.flush()
    _session_cluster.store_shards()
    return _session_cluster


@pytest.fixture(params=["single", "cluster"])
def redis_or_cluster(request: pytest.FixtureRequest) -> RedisServer | RedisCluster:
    """One Redis, then the shared cluster: the driver suites that take it run on both."""
    if request.param == "single":
        return cast(RedisServer, request.getfixturevalue("redis_server"))
    return cast(RedisCluster, request.getfixturevalue("redis_cluster"))


@pytest.fixture(params=OWN_CLUSTERS, ids=lambda p: f"{p[0]}primaries-{p[1]}shards")
def cluster(request: pytest.FixtureRequest) -> Iterator[RedisCluster]:
    """A cluster of the test's own (not the shared ``redis_cluster``), for tests that kill, stop
    or reshard its nodes: 3 primaries with the default 16 shards, then 4 with 64."""
    primaries, shards = request.param
    yield from _started_cluster(primaries=primaries, shards=shards)


def _started_cluster(
    node_timeout_ms: int = RedisCluster.NODE_TIMEOUT_MS, *, primaries: int = 3, shards: int = 16
) -> Iterator[RedisCluster]:
    """A started cluster, closed when the generator is (also when starting it failed half-way)."""
    cluster = RedisCluster(node_timeout_ms=node_timeout_ms, primaries=primaries, shards=shards)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sync_backend() -> str:
    return "threads"


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    """A local Polar on a free port, its clock running from now (tests advance it)."""
    with emulators.started(port=0, sync_delay=1.0) as emu:
        yield emu


@pytest.fixture
def public_emulator() -> Iterator[Emulator]:
    """A local Polar serving only its public API (no `/v1/outpost/`), recomputing a customer's
    meters a second after the last ingest, or 20 s at the most."""
    with emulators.started(port=0, public_only=True, recompute_delays=(1.0, 20.0)) as emu:
        yield emu


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook endpoint on loopback that records what Polar sends it."""
    r = Receiver()
    yield r
    r.close()


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
    with emulators.started(port=0, sync_delay=1.0, tls=(authority.chain, authority.key)) as emu:
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
