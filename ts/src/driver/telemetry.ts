/** Telemetry through OpenTelemetry, with the names both SDKs share (outpost_core/semconv.py):
 * the ingest and read durations with their outcome, the buckets written, and spans for each
 * snapshot applied, each WebSocket connection and each reconnection. Records name the meter and
 * the customer, so they go to providers of Outpost's own, exported to Polar's relay with delta
 * temporality once per interval (the flush that ends an interval exports it): an export carries
 * the series active in its interval, and the SDK lets them go after it. An interval admits at most
 * SERIES_CAP series per instrument; what that leaves out is counted (outpost.telemetry.left_out,
 * and one debug line per interval). The application's global providers receive the same records
 * only with `telemetryToApp: true`. Never an event's metadata, never the token. */

import { type Counter, type Histogram, type Meter, type Span, type Tracer, metrics, trace } from "@opentelemetry/api";
import { OTLPMetricExporter } from "@opentelemetry/exporter-metrics-otlp-http";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { AggregationTemporalityPreference } from "@opentelemetry/exporter-metrics-otlp-http";
import { MeterProvider, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";
import { BasicTracerProvider, BatchSpanProcessor } from "@opentelemetry/sdk-trace-base";
import type { Observation } from "../core/observations.js";

export const SDK_VERSION = "0.1.0";

/** One set of instruments: the application's (global providers) or the relay's (private). */
class Instruments {
  readonly ingest: Histogram;
  readonly read: Histogram;
  readonly warm: Counter;
  readonly admission: Histogram;
  readonly buckets: Counter;
  readonly leftOut: Counter;

  constructor(
    meter: Meter,
    readonly tracer: Tracer,
  ) {
    const advice = { explicitBucketBoundaries: [...DURATION_BOUNDARIES] };
    this.ingest = meter.createHistogram(INGEST_DURATION, { unit: "s", description: "Duration of one track() write", advice });
    this.read = meter.createHistogram(READ_DURATION, { unit: "s", description: "Duration of one balance() read memory did not answer at once", advice });
    this.admission = meter.createHistogram(ADMISSION_DURATION, { unit: "s", description: "Duration of one admission: reserve, commit, release, conditional track", advice });
    this.warm = meter.createCounter(READ_WARM, { description: "balance() reads answered from memory" });
    this.buckets = meter.createCounter(BUCKETS_WRITTEN, { description: "Bucket aggregates written by track()" });
    this.leftOut = meter.createCounter(SERIES_LEFT_OUT, { description: "Records of an export interval left out by the cap on series" });
  }
}

export interface RelayOptions {
  /** Polar's API: the relay is at <url>/v1/outpost/telemetry/v1/{metrics,traces}. */
  url: string | null;
  token: string | null;
  /** Seconds between two exports. */
  interval: number;
  /** Also record into the application's global providers (off: the records name customers). */
  toApp?: boolean;
  /** Distinct series per instrument admitted into one export interval. */
  seriesCap?: number;
}

/** The bucket boundaries of both duration histograms, seconds: 0.1 ms to 1 s (semconv.py says why). */
export const DURATION_BOUNDARIES = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0] as const;
export const INGEST_DURATION = "outpost.ingest.duration";
export const READ_DURATION = "outpost.read.duration";
/** Reads answered from memory, counted rather than timed (timing one would cost as much as it). */
export const READ_WARM = "outpost.read.warm";
export const BUCKETS_WRITTEN = "outpost.buckets.written";
/** One record per admission (reserve, a reservation's commit or release, a track with
 * requireBalance), with its operation and outcome. */
export const ADMISSION_DURATION = "outpost.admission.duration";
/** Records of one export interval left out by the cap on series (no attributes). */
export const SERIES_LEFT_OUT = "outpost.telemetry.left_out";
/** Distinct series (attribute sets) per instrument in one export interval, as the Python SDK. */
export const SERIES_CAP = 1_000;
/** The reader's own timer, never reached: the flush that ends an interval exports it. */
const NO_TIMER_MS = 2_147_483_647;
export const SPAN_CONNECTION = "outpost.connection";
export const SPAN_RECONNECTION = "outpost.reconnection";
export const SPAN_SNAPSHOT = "outpost.snapshot.received";
export const SPAN_SYNCS = "outpost.syncs";

const CAP = 20_000; // buffered records between two flushes; beyond it, records are dropped
const FLUSH_EVERY = 1.0;
const SLICE = 256; // records made between two turns of the event loop

/** Resolves once the event loop has run what was waiting (I/O callbacks included). */
function aTurnOfTheLoop(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** `external:<id>` or `customer:<id>`, as semconv's outpost.customer. */
export function customerAttribute(externalCustomerId: unknown, customerId: unknown): string {
  if (typeof externalCustomerId === "string") return `external:${externalCustomerId}`;
  if (typeof customerId === "string") return `customer:${customerId}`;
  return "";
}

interface ReadRecord {
  meterId: string;
  customer: string;
  seconds: number;
  outcome: string;
}

interface AdmissionRecord {
  operation: string;
  customer: string;
  meterIds: readonly string[];
  seconds: number;
  outcome: string;
}

interface TrackRecord {
  customer: string;
  meterIds: readonly string[];
  seconds: number;
  outcome: string;
  buckets: number;
}

export class Telemetry {
  private readonly sets: Instruments[] = [];
  private relay: { meters: MeterProvider; tracers: BasicTracerProvider } | null = null;
  private relayTried = false;
  private connection: Span[] = [];
  private reconnection: Span[] = [];
  private reads: ReadRecord[] = [];
  /** Warm reads since the last flush, per meter id and customer attribute. */
  private warmReads = new Map<string, Map<string, number>>();
  private tracks: TrackRecord[] = [];
  private admissions: AdmissionRecord[] = [];
  private nextFlush = 0;
  private nextReport = 0;
  private reported: [number, number] = [0, 0];
  /** The flush recording now (each waits for the one before it). */
  private flushing: Promise<void> = Promise.resolve();
  /** This interval's admitted series, per instrument, and the records the cap left out. */
  private series = new Map<string, Set<string>>();
  private leftOut = 0;
  private intervalEnds: number | null = null;
  private exporting: Promise<void> | null = null;

  constructor(
    readonly enabled: boolean,
    private readonly relayOptions: RelayOptions = { url: null, token: null, interval: 30 },
    private warn: (message: string) => void = () => {},
    private readonly debug: (message: string) => void = () => {},
  ) {
    if (enabled && relayOptions.toApp) this.sets.push(new Instruments(metrics.getMeter("outpost", SDK_VERSION), trace.getTracer("outpost", SDK_VERSION)));
  }

  /** Start exporting to Polar's relay, once the organization is known (a maintained OTLP/HTTP
   * exporter, as the Python SDK). Telemetry never raises into the caller. */
  exportToRelay(organizationId: string | null): void {
    const { url, token, interval } = this.relayOptions;
    if (!this.enabled || this.relayTried || !url || !token) return;
    this.relayTried = true;
    try {
      const base = `${url.replace(/\/+$/, "")}/v1/outpost/telemetry/v1`;
      const headers = { authorization: `Bearer ${token}` };
      const resource = resourceFromAttributes({
        "service.name": "outpost-node",
        "outpost.sdk.version": SDK_VERSION,
        "polar.organization_id": organizationId ?? "",
      });
      // Delta: an export carries its interval's series only, and the SDK lets them go after it.
      const reader = new PeriodicExportingMetricReader({
        exporter: new OTLPMetricExporter({
          url: `${base}/metrics`,
          headers,
          timeoutMillis: 10_000,
          temporalityPreference: AggregationTemporalityPreference.DELTA,
        }),
        exportIntervalMillis: NO_TIMER_MS,
        exportTimeoutMillis: 10_000,
      });
      const meters = new MeterProvider({ resource, readers: [reader] });
      const tracers = new BasicTracerProvider({
        resource,
        spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter({ url: `${base}/traces`, headers, timeoutMillis: 10_000 }), { scheduledDelayMillis: interval * 1000 })],
      });
      this.relay = { meters, tracers };
      this.sets.push(new Instruments(meters.getMeter("outpost", SDK_VERSION), tracers.getTracer("outpost", SDK_VERSION)));
    } catch (exc) {
      this.warn(`outpost telemetry: could not start the relay exporter: ${String(exc)}`);
    }
  }

  // The hot paths only append to a bounded buffer; flush() records it, about once a second.

  tracked(customer: string, meterIds: readonly string[], seconds: number, outcome: string, buckets: number): void {
    if (this.enabled && this.tracks.length < CAP) this.tracks.push({ customer, meterIds, seconds, outcome, buckets });
  }

  /** An admission ended: `operation` is reserve, commit, release or track (requireBalance). */
  admitted(operation: string, customer: string, meterIds: readonly string[], seconds: number, outcome: string): void {
    if (this.enabled && this.admissions.length < CAP) this.admissions.push({ operation, customer, meterIds, seconds, outcome });
  }

  /** A read memory answered: one map increment, no clock. */
  readWarm(meterId: string, customer: string): void {
    if (!this.enabled) return;
    let perCustomer = this.warmReads.get(meterId);
    if (perCustomer === undefined) this.warmReads.set(meterId, (perCustomer = new Map()));
    perCustomer.set(customer, (perCustomer.get(customer) ?? 0) + 1);
  }

  readDone(meterId: string, customer: string, seconds: number, outcome: string): void {
    if (this.enabled && this.reads.length < CAP) this.reads.push({ meterId, customer, seconds, outcome });
  }

  /** Record the buffered reads and writes; report the syncs every export interval. Recording
   * costs a few µs a record (about 33 ms for 10,000 tracks), so the event loop runs between slices
   * of SLICE records: done at once, it held every message the subscriber was to apply. */
  async flush(now: number, received: number, applied: number, force = false): Promise<void> {
    if (!this.enabled || (now < this.nextFlush && !force)) return;
    this.nextFlush = now + FLUSH_EVERY;
    const reads = this.reads;
    const tracks = this.tracks;
    const admissions = this.admissions;
    const warm = this.warmReads;
    this.reads = [];
    this.tracks = [];
    this.admissions = [];
    this.warmReads = new Map();
    const previous = this.flushing;
    const flushing = this.record(previous, reads, tracks, admissions, warm, now, received, applied, force);
    this.flushing = flushing;
    await flushing;
  }

  private async record(
    previous: Promise<void>,
    reads: ReadRecord[],
    tracks: TrackRecord[],
    admissions: AdmissionRecord[],
    warm: Map<string, Map<string, number>>,
    now: number,
    received: number,
    applied: number,
    force: boolean,
  ): Promise<void> {
    await previous; // one flush records at a time, in order
    try {
      this.intervalEnds ??= now + this.relayOptions.interval;
      // Admitted once per flush (not per set of instruments): both sets get the same records.
      reads = reads.filter((r) => this.admit(READ_DURATION, r.meterId, r.customer, r.outcome));
      const warmKept: [string, string, number][] = [];
      for (const [meterId, perCustomer] of warm) {
        for (const [customer, n] of perCustomer) if (this.admit(READ_WARM, meterId, customer)) warmKept.push([meterId, customer, n]);
      }
      const ingests: [TrackRecord, string][] = [];
      const buckets: TrackRecord[] = [];
      for (const t of tracks) {
        for (const meterId of t.meterIds.length ? t.meterIds : [""]) {
          if (this.admit(INGEST_DURATION, meterId, t.customer, t.outcome)) ingests.push([t, meterId]);
        }
        if (t.buckets && this.admit(BUCKETS_WRITTEN, t.customer, ...t.meterIds)) buckets.push(t);
      }
      const admitted: [AdmissionRecord, string][] = [];
      for (const a of admissions) {
        for (const meterId of a.meterIds.length ? a.meterIds : [""]) {
          if (this.admit(ADMISSION_DURATION, meterId, a.customer, a.operation, a.outcome)) admitted.push([a, meterId]);
        }
      }
      let made = 0;
      for (const set of this.sets) {
        for (const r of reads) {
          set.read.record(r.seconds, { "outpost.meter_id": r.meterId, "outpost.customer": r.customer, "outpost.outcome": r.outcome });
          if (++made % SLICE === 0) await aTurnOfTheLoop();
        }
        for (const [meterId, customer, n] of warmKept) set.warm.add(n, { "outpost.meter_id": meterId, "outpost.customer": customer });
        for (const [t, meterId] of ingests) {
          set.ingest.record(t.seconds, { "outpost.meter_id": meterId, "outpost.customer": t.customer, "outpost.outcome": t.outcome });
          if (++made % SLICE === 0) await aTurnOfTheLoop();
        }
        for (const [a, meterId] of admitted) {
          set.admission.record(a.seconds, { "outpost.meter_id": meterId, "outpost.customer": a.customer, "outpost.admission.operation": a.operation, "outpost.outcome": a.outcome });
        }
        for (const t of buckets) set.buckets.add(t.buckets, { "outpost.customer": t.customer, "outpost.meter_ids": [...t.meterIds] });
      }
      if (force || now >= this.intervalEnds) this.endInterval(now, force);
      const changed = received !== this.reported[0] || applied !== this.reported[1];
      if (changed && (now >= this.nextReport || force)) {
        this.nextReport = now + this.relayOptions.interval;
        const attributes = { "outpost.syncs.received": received - this.reported[0], "outpost.syncs.applied": applied - this.reported[1] };
        for (const set of this.sets) set.tracer.startSpan(SPAN_SYNCS, { attributes }).end();
        this.reported = [received, applied];
      }
    } catch (exc) {
      this.warn(`outpost telemetry failed: ${String(exc)}`);
    }
  }

  /** Whether a record of this series fits in the interval's cap (counted when it does not). */
  private admit(instrument: string, ...attributes: string[]): boolean {
    let admitted = this.series.get(instrument);
    if (admitted === undefined) this.series.set(instrument, (admitted = new Set()));
    const key = JSON.stringify(attributes);
    if (admitted.has(key)) return true;
    if (admitted.size >= (this.relayOptions.seriesCap ?? SERIES_CAP)) {
      this.leftOut += 1;
      return false;
    }
    admitted.add(key);
    return true;
  }

  /** The interval ends: count what the cap left out, export it (not at close: shutdown does). */
  private endInterval(now: number, closing: boolean): void {
    if (this.leftOut) {
      for (const set of this.sets) set.leftOut.add(this.leftOut);
      this.debug(`outpost telemetry: ${this.leftOut} records of this interval left out (more than ${this.relayOptions.seriesCap ?? SERIES_CAP} series per instrument)`);
    }
    this.leftOut = 0;
    this.series = new Map();
    this.intervalEnds = now + this.relayOptions.interval;
    const relay = this.relay;
    if (closing || relay === null || this.exporting !== null) return; // one at a time: the next takes this too
    this.exporting = relay.meters.forceFlush().then(
      () => {
        this.exporting = null;
      },
      (exc: unknown) => {
        this.exporting = null;
        this.debug(`outpost telemetry: an export failed: ${String(exc)}`);
      },
    );
  }

  observe(observations: Observation[]): void {
    if (!this.enabled) return;
    for (const seen of observations) {
      if (seen.kind === "SnapshotApplied") {
        const attributes: Record<string, string | number | string[] | number[]> = {
          "outpost.customer": seen.customer,
          "outpost.snapshot_id": seen.snapshotId,
          "outpost.cold_until": seen.coldUntil,
          "outpost.snapshot.counted": seen.counted,
          "outpost.meter_ids": seen.meterIds,
          "outpost.local.consumed": seen.localConsumed.map((v) => (Number.isFinite(v) ? v : -1)),
          "outpost.polar.consumed": seen.polarConsumed,
        };
        if (seen.meterIds.length === 1) attributes["outpost.meter_id"] = seen.meterIds[0] as string;
        for (const set of this.sets) set.tracer.startSpan(SPAN_SNAPSHOT, { attributes }).end();
      } else if (seen.state === "open") {
        for (const span of this.reconnection) {
          span.setAttribute("outpost.outcome", "ok");
          span.end();
        }
        for (const span of this.connection) span.end();
        this.reconnection = [];
        this.connection = this.sets.map((set) => set.tracer.startSpan(SPAN_CONNECTION, { attributes: { "outpost.attempt": seen.connections } }));
      } else {
        for (const span of this.connection) {
          span.setAttribute("outpost.reason", seen.reason ?? "");
          span.end();
        }
        this.connection = [];
        if (!this.reconnection.length) {
          this.reconnection = this.sets.map((set) => set.tracer.startSpan(SPAN_RECONNECTION, { attributes: { "outpost.reason": seen.reason ?? "" } }));
        }
      }
    }
  }

  /** From now on (the instance is closing), a failure is one DEBUG line, never a warning: Polar
   * being down at shutdown is no news to the operator. */
  quiet(): void {
    this.warn = this.debug;
  }

  /** Record what is buffered, end the open spans and send what the relay exporter holds, for at
   * most `bound` seconds (the exporter goes on trying in the background, unwaited). */
  async shutdown(now: number, received: number, applied: number, bound = 10): Promise<void> {
    await this.flush(now, received, applied, true); // after any flush still recording
    for (const span of [...this.connection, ...this.reconnection]) span.end();
    this.connection = this.reconnection = [];
    const relay = this.relay;
    this.relay = null;
    if (relay === null) return;
    let timer: NodeJS.Timeout | undefined;
    const exported = Promise.all([relay.meters.shutdown(), relay.tracers.shutdown()]).then(
      () => null,
      (exc: unknown) => String(exc),
    );
    const late = new Promise<string>((resolve) => {
      timer = setTimeout(() => resolve(`not done within ${bound} s`), Math.max(0, bound) * 1000);
    });
    const failure = await Promise.race([exported, late]);
    clearTimeout(timer);
    if (failure !== null) this.warn(`outpost telemetry: the last export failed at close: ${failure}`);
  }
}
