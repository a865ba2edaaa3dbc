"""Outpost's telemetry through OpenTelemetry (names in ``outpost_core.semconv``).

Records name the meter and the customer, so they go to providers of Outpost's own: when the
optional ``telemetry`` extra is installed, a private pair of SDK providers exports them every
export interval to Polar's relay, tagged with the organization and the SDK version. The metrics
are delta: each export carries the series active in its interval, and the SDK forgets them after
it (``reset_on_collect``, opentelemetry-sdk 1.45.2 and later), so memory follows the customers of
one interval, never all the customers ever seen. The application's own global providers receive
the same records only when it asks (``to_app=True``): per-customer series are not what an
application's pipeline expects, and customer ids are often emails. What to record and when
(including the cap on series per interval) is the core's
:class:`~outpost_core._telemetry.Recorder`; this module only turns what it drains into
instruments and spans. The hot paths append to its buffers
(a warm read is counted by the session); ``flush``, called by the driver about once a second,
records them into the instruments, off the hot path.
Nothing here ever raises into the caller: telemetry failures are logged and forgotten.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import metrics, trace

from outpost_core import __version__, semconv
from outpost_core.telemetry import (
    SERIES_CAP,
    Drained,
    Observation,
    ReadKey,
    Recorder,
    SpanDone,
    SpanOp,
    SpanStarted,
)

VERSION = __version__
LAST_EXPORT = 0.75
"""Seconds the export at close may take. The OTLP exporter (1.45) waits at least 0.8 s before
its first retry, so within this bound it makes one attempt; at the bound its exporters are shut
down, which ends any wait for a retry."""


_SLICE = 64  # records made between two hand-overs of the GIL (about 0.5 ms of them)


def _duration(meter: metrics.Meter, name: str, what: str) -> metrics.Histogram:
    """A histogram of durations in seconds, on semconv's duration buckets."""
    return meter.create_histogram(
        name,
        unit="s",
        description=f"Duration of {what}",
        explicit_bucket_boundaries_advisory=semconv.DURATION_BOUNDARIES,
    )


class _Instruments:
    def __init__(self, meter: metrics.Meter, tracer: trace.Tracer) -> None:
        self.tracer = tracer
        self.ingest = _duration(meter, semconv.INGEST_DURATION, "one track() write")
        self.read = _duration(meter, semconv.READ_DURATION, "one balance() read")
        self.admission = _duration(
            meter,
            semconv.ADMISSION_DURATION,
            "one admission: reserve, commit, release, conditional track",
        )
        self.warm = meter.create_counter(
            semconv.READ_WARM, description="balance() reads answered from memory"
        )
        self.buckets = meter.create_counter(
            semconv.BUCKETS_WRITTEN, description="Bucket aggregates written by track()"
        )
        self.left_out = meter.create_counter(
            semconv.SERIES_LEFT_OUT,
            description="Records of an export interval left out by the cap on series",
        )

    def record(self, drained: Drained) -> None:
        for n, r in enumerate(drained.reads):
            self.read.record(r.value, r.attributes)
            if n % _SLICE == _SLICE - 1:
                time.sleep(0)  # let the application's threads have the GIL between slices
        for n, r in enumerate(drained.ingests):
            self.ingest.record(r.value, r.attributes)
            if n % _SLICE == _SLICE - 1:
                time.sleep(0)
        for r in drained.admissions:
            self.admission.record(r.value, r.attributes)
        for r in drained.buckets:
            self.buckets.add(int(r.value), r.attributes)
        for r in drained.warm:
            self.warm.add(int(r.value), r.attributes)
        for span in drained.spans:
            self.tracer.start_span(span.name, attributes=span.attributes).end()
        if drained.left_out:
            self.left_out.add(drained.left_out)


class Telemetry:
    """The OpenTelemetry side of :class:`outpost_core._telemetry.Recorder` (its policy)."""

    def __init__(
        self,
        *,
        enabled: bool,
        relay_url: str | None,
        token: str | None,
        export_interval: float = 30.0,
        logger: logging.Logger | None = None,
        ca_bundle: str | None = None,
        to_app: bool = False,
        series_cap: int = SERIES_CAP,
    ) -> None:
        self.enabled = enabled
        self._ca_bundle = ca_bundle
        self._relay_url = relay_url
        self._token = token
        self._interval = export_interval
        self._log = logger or logging.getLogger("outpost")
        # The hot paths (a track, a read memory did not answer) append to it directly.
        self.recorder = Recorder(export_interval=export_interval, series_cap=series_cap)
        self._instruments: list[_Instruments] = []
        self._providers: list[Any] = []
        self._exporters: list[Any] = []
        self._quiet = False
        self._spans: dict[str, list[Any]] = {}
        # The telemetry worker flushes on its thread; close() flushes last, after it: one at a
        # time, so the exporters are shut down after the worker's last records, not during them.
        self._flushing = threading.RLock()
        self._export: threading.Thread | None = None
        if enabled and to_app:  # per-customer series reach the application only when asked
            self._instruments.append(
                _Instruments(
                    metrics.get_meter(semconv.INSTRUMENTATION, VERSION),
                    trace.get_tracer(semconv.INSTRUMENTATION, VERSION),
                )
            )

    # -- slow paths -----------------------------------------------------------------------------

    @property
    def exporting(self) -> bool:
        """Whether :meth:`export_to_relay` has nothing left to do: started (or failed to), or
        there is no relay to export to."""
        return bool(self._providers) or not (self.enabled and self._relay_url and self._token)

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
            self._apply(self.recorder.observe(observations))
        except Exception:  # pragma: no cover - telemetry never breaks the caller
            self._log.exception("outpost telemetry failed")

    def _apply(self, ops: Sequence[SpanOp]) -> None:
        for op in ops:
            if isinstance(op, SpanDone):
                for instruments in self._instruments:
                    instruments.tracer.start_span(op.name, attributes=op.attributes).end()
            elif isinstance(op, SpanStarted):
                self._spans[op.kind] = [
                    i.tracer.start_span(op.name, attributes=op.attributes)
                    for i in self._instruments
                ]
            else:
                for span in self._spans.pop(op.kind, []):
                    for name, value in op.attributes.items():
                        span.set_attribute(name, value)
                    span.end()

    def due(self, now: float) -> bool:
        """Whether :meth:`flush` records anything at ``now`` (monotonic seconds)."""
        return self.enabled and self.recorder.due(now)

    def flush(
        self,
        now: float,
        received: int,
        applied: int,
        warm: Mapping[ReadKey, int] | None = None,
        force: bool = False,
    ) -> None:
        """Record what was buffered, and the warm reads counted meanwhile (``warm``, from
        ``Session.warm_reads``); report syncs every export interval."""
        if not self.enabled or not (force or self.recorder.due(now)):
            return
        with self._flushing:
            try:
                drained = self.recorder.drain(now, received, applied, warm, force=force)
                for instruments in self._instruments:
                    instruments.record(drained)
                if drained.left_out:
                    self._log.debug(
                        "outpost telemetry: %d records of this interval left out "
                        "(more than %d series per instrument)",
                        drained.left_out,
                        self.recorder.series_cap,
                    )
                if drained.export and not force:
                    self._export_now()
            except Exception:  # pragma: no cover - telemetry never breaks the caller
                self._log.exception("outpost telemetry failed")

    def _export_now(self) -> None:
        """Export the interval that just ended, on a thread of its own: a relay that is slow or
        down holds that thread (up to the exporter's timeout), never the worker or close()."""
        provider = self._providers[0] if self._providers else None
        if provider is None or (self._export is not None and self._export.is_alive()):
            return  # nothing to export to, or one still going: the next export takes this too
        self._export = threading.Thread(
            target=provider.force_flush, name="outpost-telemetry-export", daemon=True
        )
        self._export.start()

    def quiet(self) -> None:
        """From now until the last export is done, OpenTelemetry's failures are held back: the
        instance is closing (``shutdown`` reports them as one line)."""
        if not self._quiet and any(p is not None for p in self._providers):
            self._quiet = True
            _QUIET.hold()

    def shutdown(
        self,
        now: float,
        received: int,
        applied: int,
        warm: Mapping[ReadKey, int] | None = None,
        bound: float = LAST_EXPORT,
    ) -> None:
        """Record what is buffered, end the open spans, and export to the relay one last time
        within ``bound`` seconds. The relay is Polar: when it is down the application is often
        exiting because of it, so a failure here is one DEBUG line, never a retry or a trace."""
        with self._flushing:
            self.flush(now, received, applied, warm, force=True)
            if self.enabled:
                self._apply(self.recorder.close())
            self.quiet()
            providers = [p for p in self._providers if p is not None]
            self._providers = [None]  # nothing starts again after the close
        if providers:
            failure = _shut_down_within(providers, self._exporters, max(bound, 0.0))
            if failure is not None:
                self._log.debug("outpost telemetry: the last export failed at close: %s", failure)


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
                    # The metric reader has no timer (the drains drive the exports), so its
                    # shutdown exports nothing by itself: the interval under way goes now.
                    provider.force_flush()
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
    from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        PeriodicExportingMetricReader,
    )
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
    # Delta: an export carries the interval's series only, and the SDK lets them go after it.
    delta: dict[type, AggregationTemporality] = {
        Counter: AggregationTemporality.DELTA,
        Histogram: AggregationTemporality.DELTA,
    }
    metric_exporter = OTLPMetricExporter(
        endpoint=f"{base}/metrics",
        headers=headers,
        timeout=10,
        certificate_file=ca_bundle,
        preferred_temporality=delta,
    )
    span_exporter = OTLPSpanExporter(
        endpoint=f"{base}/traces", headers=headers, timeout=10, certificate_file=ca_bundle
    )
    # No timer of its own: the drain that ends an export interval exports it (``_export_now``),
    # so an export holds exactly the interval's records.
    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=math.inf)
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
