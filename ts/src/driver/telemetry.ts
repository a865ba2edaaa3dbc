/** Telemetry through @opentelemetry/api, with the names both SDKs share (outpost_core/semconv.py):
 * the ingest and read durations with their outcome, the buckets written, and spans for each
 * snapshot applied, each WebSocket connection and each reconnection. Instruments come from the
 * global providers, so an application's own OpenTelemetry set-up receives them; without one the
 * API's no-op providers record nothing. Never an event's metadata, never the token. */

import { type Counter, type Histogram, type Meter, type Span, type Tracer, metrics, trace } from "@opentelemetry/api";
import { OTLPMetricExporter } from "@opentelemetry/exporter-metrics-otlp-http";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { MeterProvider, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";
import { BasicTracerProvider, BatchSpanProcessor } from "@opentelemetry/sdk-trace-base";
import type { Observation } from "../core/observations.js";

export const SDK_VERSION = "0.1.0";

/** One set of instruments: the application's (global providers) or the relay's (private). */
class Instruments {
  readonly ingest: Histogram;
  readonly read: Histogram;
  readonly warm: Counter;
  readonly buckets: Counter;

  constructor(
    meter: Meter,
    readonly tracer: Tracer,
  ) {
    const advice = { explicitBucketBoundaries: [...DURATION_BOUNDARIES] };
    this.ingest = meter.createHistogram(INGEST_DURATION, { unit: "s", description: "Duration of one track() write", advice });
    this.read = meter.createHistogram(READ_DURATION, { unit: "s", description: "Duration of one balance() read memory did not answer at once", advice });
    this.warm = meter.createCounter(READ_WARM, { description: "balance() reads answered from memory" });
    this.buckets = meter.createCounter(BUCKETS_WRITTEN, { description: "Bucket aggregates written by track()" });
  }
}

export interface RelayOptions {
  /** Polar's API: the relay is at <url>/v1/outpost/telemetry/v1/{metrics,traces}. */
  url: string | null;
  token: string | null;
  /** Seconds between two exports. */
  interval: number;
}

/** The bucket boundaries of both duration histograms, seconds: 0.1 ms to 1 s (semconv.py says why). */
export const DURATION_BOUNDARIES = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0] as const;
export const INGEST_DURATION = "outpost.ingest.duration";
export const READ_DURATION = "outpost.read.duration";
/** Reads answered from memory, counted rather than timed (timing one would cost as much as it). */
export const READ_WARM = "outpost.read.warm";
export const BUCKETS_WRITTEN = "outpost.buckets.written";
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
  private nextFlush = 0;
  private nextReport = 0;
  private reported: [number, number] = [0, 0];
  /** The flush recording now (each waits for the one before it). */
  private flushing: Promise<void> = Promise.resolve();

  constructor(
    readonly enabled: boolean,
    private readonly relayOptions: RelayOptions = { url: null, token: null, interval: 30 },
    private readonly warn: (message: string) => void = () => {},
  ) {
    if (enabled) this.sets.push(new Instruments(metrics.getMeter("outpost", SDK_VERSION), trace.getTracer("outpost", SDK_VERSION)));
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
      const reader = new PeriodicExportingMetricReader({
        exporter: new OTLPMetricExporter({ url: `${base}/metrics`, headers, timeoutMillis: 10_000 }),
        exportIntervalMillis: interval * 1000,
        exportTimeoutMillis: Math.min(10_000, interval * 1000),
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
    const warm = this.warmReads;
    this.reads = [];
    this.tracks = [];
    this.warmReads = new Map();
    const previous = this.flushing;
    const flushing = this.record(previous, reads, tracks, warm, now, received, applied, force);
    this.flushing = flushing;
    await flushing;
  }

  private async record(
    previous: Promise<void>,
    reads: ReadRecord[],
    tracks: TrackRecord[],
    warm: Map<string, Map<string, number>>,
    now: number,
    received: number,
    applied: number,
    force: boolean,
  ): Promise<void> {
    await previous; // one flush records at a time, in order
    try {
      let made = 0;
      for (const set of this.sets) {
        for (const r of reads) {
          set.read.record(r.seconds, { "outpost.meter_id": r.meterId, "outpost.customer": r.customer, "outpost.outcome": r.outcome });
          if (++made % SLICE === 0) await aTurnOfTheLoop();
        }
        for (const [meterId, perCustomer] of warm) {
          for (const [customer, n] of perCustomer) set.warm.add(n, { "outpost.meter_id": meterId, "outpost.customer": customer });
        }
        for (const t of tracks) {
          for (const meterId of t.meterIds.length ? t.meterIds : [""]) {
            set.ingest.record(t.seconds, { "outpost.meter_id": meterId, "outpost.customer": t.customer, "outpost.outcome": t.outcome });
          }
          if (t.buckets) set.buckets.add(t.buckets, { "outpost.customer": t.customer, "outpost.meter_ids": [...t.meterIds] });
          if (++made % SLICE === 0) await aTurnOfTheLoop();
        }
      }
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

  /** Record what is buffered, end the open spans and send what the relay exporter holds. */
  async shutdown(now: number, received: number, applied: number): Promise<void> {
    await this.flush(now, received, applied, true); // after any flush still recording
    for (const span of [...this.connection, ...this.reconnection]) span.end();
    this.connection = this.reconnection = [];
    const relay = this.relay;
    this.relay = null;
    if (relay === null) return;
    try {
      await Promise.all([relay.meters.shutdown(), relay.tracers.shutdown()]);
    } catch (exc) {
      this.warn(`outpost telemetry: the last export failed: ${String(exc)}`);
    }
  }
}
