"""Outpost's telemetry through OpenTelemetry (names in ``outpost_core.semconv``).

Instruments and spans come from OpenTelemetry's global providers, so an application's own set-up
receives them; when the optional ``telemetry`` extra is installed, a private pair of SDK providers
also exports them every 30 seconds to Polar's relay, tagged with the organization and the SDK
version. The hot paths (``read``, ``tracked``) only append to a bounded buffer; ``flush``, called
by the driver about once a second, records the buffer into the instruments, off the hot path.
Nothing here ever raises into the caller: telemetry failures are logged and forgotten.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import metrics, trace

from outpost_core import __version__, semconv
from outpost_core._observations import LinkChanged, Observation, SnapshotApplied

VERSION = __version__
_CAP = 20_000  # buffered records between two flushes; beyond it, records are counted, not kept
_FLUSH_EVERY = 1.0
LAST_EXPORT = 0.75
"""Seconds the export at close may take. The OTLP exporter (1.45) waits at least 0.8 s before
its first retry, so within this bound it makes one attempt; at the bound its exporters are shut
down, which ends any wait for a retry."""


class _Instruments:
    def __init__(self, meter: metrics.Meter, tracer: trace.Tracer) -> None:
        self.tracer = tracer
        self.ingest = meter.create_histogram(
            semconv.INGEST_DURATION, unit="s", description="Duration of one track() write"
        )
        self.read = meter.create_histogram(
            semconv.READ_DURATION, unit="s", description="Duration of one balance() read"
        )
        self.buckets = meter.create_counter(
            semconv.BUCKETS_WRITTEN, description="Bucket aggregates written by track()"
        )


def _customer(external_customer_id: str | None, customer_id: str | None) -> str:
    if external_customer_id is not None:
        return f"external:{external_customer_id}"
    return f"customer:{customer_id}"


class Telemetry:
    def __init__(
        self,
        *,
        enabled: bool,
        relay_url: str | None,
        token: str | None,
        export_interval: float = 30.0,
        logger: logging.Logger | None = None,
        ca_bundle: str | None = None,
    ) -> None:
        self.enabled = enabled
        self._ca_bundle = ca_bundle
        self._relay_url = relay_url
        self._token = token
        self._interval = export_interval
        self._log = logger or logging.getLogger("outpost")
        self._reads: list[tuple[str, str | None, str | None, int, str]] = []
        self._tracks: list[tuple[str | None, str | None, tuple[str, ...], int, str, int]] = []
        self._overflow = 0
        self._next_flush = 0.0
        self._instruments: list[_Instruments] = []
        self._providers: list[Any] = []
        self._exporters: list[Any] = []
        self._quiet = False
        self._connection: list[Any] = []
        self._reconnection: list[Any] = []
        self._reported = (0, 0)
        self._next_report = 0.0
        if enabled:
            self._instruments.append(
                _Instruments(
                    metrics.get_meter(semconv.INSTRUMENTATION, VERSION),
                    trace.get_tracer(semconv.INSTRUMENTATION, VERSION),
                )
            )

    # -- hot paths: append only ---------------------------------------------------------------

    def read(
        self,
        meter_id: str,
        external_customer_id: str | None,
        customer_id: str | None,
        started_ns: int,
        outcome: str,
    ) -> None:
        if len(self._reads) < _CAP:
            elapsed = time.perf_counter_ns() - started_ns
            self._reads.append((meter_id, external_customer_id, customer_id, elapsed, outcome))
        else:
            self._overflow += 1

    def tracked(
        self,
        external_customer_id: str | None,
        customer_id: str | None,
        meter_ids: tuple[str, ...],
        started_ns: int,
        outcome: str,
        buckets: int,
    ) -> None:
        if len(self._tracks) < _CAP:
            elapsed = time.perf_counter_ns() - started_ns
            self._tracks.append(
                (external_customer_id, customer_id, meter_ids, elapsed, outcome, buckets)
            )
        else:
            self._overflow += 1

    # -- slow paths -----------------------------------------------------------------------------

    def export_to_relay(self, organization_id: str | None) -> None:
        """Start exporting through Polar's relay (once the organization is known)."""
        if not self.enabled or self._providers or not self._relay_url or not self._token:
            return
        try:
            self._providers, self._exporters = _relay_providers(
                self._relay_url, self._token, organization_id, self._interval, self._ca_bundle
            )
        except ImportError:
            self._log.info("outpost telemetry: install polar-outpost[telemetry] to export it")
            self._providers = [None]
            return
        except Exception:
            self._log.exception("outpost telemetry: could not start the exporter")
            self._providers = [None]
            return
        meter_provider, tracer_provider = self._providers
        self._instruments.append(
            _Instruments(
                meter_provider.get_meter(semconv.INSTRUMENTATION, VERSION),
                tracer_provider.get_tracer(semconv.INSTRUMENTATION, VERSION),
            )
        )

    def observe(self, observations: Sequence[Observation]) -> None:
        if not self.enabled:
            return
        try:
            for observation in observations:
                if isinstance(observation, SnapshotApplied):
                    self._snapshot(observation)
                elif isinstance(observation, LinkChanged):
                    self._link(observation)
        except Exception:  # pragma: no cover - telemetry never breaks the caller
            self._log.exception("outpost telemetry failed")

    def flush(self, now: float, received: int, applied: int, force: bool = False) -> None:
        """Record the buffered reads and writes; report syncs every export interval."""
        if not self.enabled or (now < self._next_flush and not force):
            return
        self._next_flush = now + _FLUSH_EVERY
        reads, self._reads = self._reads, []
        tracks, self._tracks = self._tracks, []
        try:
            for instruments in self._instruments:
                for meter_id, ext, cid, elapsed, outcome in reads:
                    attributes = {
                        semconv.METER: meter_id,
                        semconv.CUSTOMER: _customer(ext, cid),
                        semconv.OUTCOME: outcome,
                    }
                    instruments.read.record(elapsed / 1e9, attributes)
                for ext, cid, meters, elapsed, outcome, buckets in tracks:
                    customer = _customer(ext, cid)
                    for meter_id in meters or ("",):
                        attributes = {
                            semconv.METER: meter_id,
                            semconv.CUSTOMER: customer,
                            semconv.OUTCOME: outcome,
                        }
                        instruments.ingest.record(elapsed / 1e9, attributes)
                    if buckets:
                        instruments.buckets.add(
                            buckets, {semconv.CUSTOMER: customer, semconv.METERS: list(meters)}
                        )
            if (received, applied) != self._reported and (now >= self._next_report or force):
                self._next_report = now + self._interval
                self._syncs(received - self._reported[0], applied - self._reported[1])
                self._reported = (received, applied)
        except Exception:  # pragma: no cover - telemetry never breaks the caller
            self._log.exception("outpost telemetry failed")

    def quiet(self) -> None:
        """From now until the last export is done, OpenTelemetry's failures are held back: the
        instance is closing (``shutdown`` reports them as one line)."""
        if not self._quiet and any(p is not None for p in self._providers):
            self._quiet = True
            _QUIET.hold()

    def shutdown(self, now: float, received: int, applied: int, bound: float = LAST_EXPORT) -> None:
        """Record what is buffered, end the open spans, and export to the relay one last time
        within ``bound`` seconds. The relay is Polar: when it is down the application is often
        exiting because of it, so a failure here is one DEBUG line, never a retry or a trace."""
        self.flush(now, received, applied, force=True)
        for span in self._connection + self._reconnection:
            span.end()
        self._connection.clear()
        self._reconnection.clear()
        self.quiet()
        providers = [p for p in self._providers if p is not None]
        self._providers = [None]  # nothing starts again after the close
        if providers:
            failure = _shut_down_within(providers, self._exporters, max(bound, 0.0))
            if failure is not None:
                self._log.debug("outpost telemetry: the last export failed at close: %s", failure)

    def _snapshot(self, seen: SnapshotApplied) -> None:
        attributes: dict[str, Any] = {
            semconv.CUSTOMER: seen.customer,
            semconv.SNAPSHOT_ID: seen.snapshot_id,
            semconv.COLD_UNTIL: seen.cold_until,
            semconv.COUNTED: seen.counted,
            semconv.METERS: list(seen.meter_ids),
            semconv.LOCAL_CONSUMED: [v if math.isfinite(v) else -1.0 for v in seen.local_consumed],
            semconv.POLAR_CONSUMED: list(seen.polar_consumed),
        }
        if len(seen.meter_ids) == 1:
            attributes[semconv.METER] = seen.meter_ids[0]
        for instruments in self._instruments:
            instruments.tracer.start_span(semconv.SPAN_SNAPSHOT, attributes=attributes).end()

    def _link(self, seen: LinkChanged) -> None:
        if seen.state == "open":
            for span in self._reconnection:
                span.set_attribute(semconv.OUTCOME, semconv.OK)
                span.end()
            self._reconnection.clear()
            for span in self._connection:  # pragma: no cover - a close always comes between
                span.end()
            self._connection = [
                i.tracer.start_span(
                    semconv.SPAN_CONNECTION, attributes={"outpost.attempt": seen.connections}
                )
                for i in self._instruments
            ]
        else:
            for span in self._connection:
                span.set_attribute(semconv.REASON, seen.reason or "")
                span.end()
            self._connection = []
            if not self._reconnection:
                self._reconnection = [
                    i.tracer.start_span(
                        semconv.SPAN_RECONNECTION, attributes={semconv.REASON: seen.reason or ""}
                    )
                    for i in self._instruments
                ]

    def _syncs(self, received: int, applied: int) -> None:
        attributes = {semconv.RECEIVED: received, semconv.APPLIED: applied}
        for instruments in self._instruments:
            instruments.tracer.start_span(semconv.SPAN_SYNCS, attributes=attributes).end()


class _Quiet(logging.Filter):
    """Holds back OpenTelemetry's log records while an instance closes its exporters: their
    failures are reported as one DEBUG line instead (the first one is kept)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.closing = 0
        self.first: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self.closing <= 0:
            return True
        if self.first is None and record.levelno >= logging.WARNING:
            self.first = record.getMessage()
        return False

    def hold(self) -> None:
        # On every OpenTelemetry logger: a filter acts only on the logger a record is made on.
        for name in list(logging.root.manager.loggerDict):
            if name.startswith("opentelemetry"):
                logging.getLogger(name).addFilter(self)
        with self._lock:
            self.closing += 1

    def release(self) -> None:
        with self._lock:
            self.closing -= 1
            if self.closing == 0:
                self.first = None


_QUIET = _Quiet()


def _shut_down_within(providers: list[Any], exporters: list[Any], bound: float) -> str | None:
    """Shut the providers down (their last export) on a thread of its own, waiting for it at
    most ``bound`` seconds; then shut the exporters down, which ends their retries. The caller
    holds OpenTelemetry quiet; that thread releases it when it is done. What went wrong, or
    ``None``."""
    failures: list[str] = []
    heard: list[str | None] = []

    def run() -> None:
        try:
            for provider in providers:
                try:
                    provider.shutdown()
                except Exception as exc:  # the SDK should not raise; a failure is only news
                    failures.append(repr(exc))
        finally:
            heard.append(_QUIET.first)
            _QUIET.release()

    worker = threading.Thread(target=run, name="outpost-telemetry-close", daemon=True)
    worker.start()
    worker.join(bound)
    alive = worker.is_alive()
    first = heard[0] if heard else _QUIET.first
    if alive:
        failures.insert(0, f"not done within {bound:.2f} s" + (f" ({first})" if first else ""))
        for exporter in exporters:
            with contextlib.suppress(Exception):
                exporter.shutdown()
    elif first is not None:
        failures.insert(0, first)
    return failures[0] if failures else None


def _relay_providers(
    relay_url: str, token: str, organization_id: str | None, interval: float, ca_bundle: str | None
) -> tuple[list[Any], list[Any]]:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    base = relay_url.rstrip("/") + "/v1/outpost/telemetry/v1"
    headers = {"Authorization": f"Bearer {token}"}
    resource = Resource.create(
        {
            "service.name": "outpost-python",
            semconv.SDK_VERSION: VERSION,
            semconv.ORGANIZATION: organization_id or "",
        }
    )
    metric_exporter = OTLPMetricExporter(
        endpoint=f"{base}/metrics", headers=headers, timeout=10, certificate_file=ca_bundle
    )
    span_exporter = OTLPSpanExporter(
        endpoint=f"{base}/traces", headers=headers, timeout=10, certificate_file=ca_bundle
    )
    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=interval * 1000)
    # close() shuts them down after its last export; OpenTelemetry's own exit hooks would run
    # first (registered later) and make that export, and the second shutdown, fail.
    meter_provider = MeterProvider(
        resource=resource, metric_readers=[reader], shutdown_on_exit=False
    )
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    tracer_provider.add_span_processor(
        BatchSpanProcessor(span_exporter, schedule_delay_millis=interval * 1000)
    )
    return [meter_provider, tracer_provider], [metric_exporter, span_exporter]
