/** Telemetry through @opentelemetry/api, with the names both SDKs share (outpost_core/semconv.py):
 * the ingest and read durations with their outcome, the buckets written, and spans for each
 * snapshot applied, each WebSocket connection and each reconnection. Instruments come from the
 * global providers, so an application's own OpenTelemetry set-up receives them; without one the
 * API's no-op providers record nothing. Never an event's metadata, never the token. */

import { type Counter, type Histogram, type Span, type Tracer, metrics, trace } from "@opentelemetry/api";
import type { Observation } from "../core/observations.js";

export const INGEST_DURATION = "outpost.ingest.duration";
export const READ_DURATION = "outpost.read.duration";
export const BUCKETS_WRITTEN = "outpost.buckets.written";
export const SPAN_CONNECTION = "outpost.connection";
export const SPAN_RECONNECTION = "outpost.reconnection";
export const SPAN_SNAPSHOT = "outpost.snapshot.received";

export class Telemetry {
  private readonly ingest: Histogram | null = null;
  private readonly read: Histogram | null = null;
  private readonly buckets: Counter | null = null;
  private readonly tracer: Tracer | null = null;
  private connection: Span | null = null;
  private reconnection: Span | null = null;

  constructor(readonly enabled: boolean) {
    if (!enabled) return;
    const meter = metrics.getMeter("outpost", "0.1.0");
    this.ingest = meter.createHistogram(INGEST_DURATION, { unit: "s", description: "one record per local write (track())" });
    this.read = meter.createHistogram(READ_DURATION, { unit: "s", description: "one record per read (balance())" });
    this.buckets = meter.createCounter(BUCKETS_WRITTEN, { description: "bucket aggregates written by track()" });
    this.tracer = trace.getTracer("outpost", "0.1.0");
  }

  tracked(customer: string | null, seconds: number, outcome: string, buckets: number): void {
    const attributes = { "outpost.outcome": outcome, ...(customer === null ? {} : { "outpost.customer": customer }) };
    this.ingest?.record(seconds, attributes);
    if (buckets) this.buckets?.add(buckets, attributes);
  }

  readDone(meterId: string, seconds: number, outcome: string): void {
    this.read?.record(seconds, { "outpost.meter_id": meterId, "outpost.outcome": outcome });
  }

  observe(observations: Observation[]): void {
    const tracer = this.tracer;
    if (tracer === null) return;
    for (const seen of observations) {
      if (seen.kind === "SnapshotApplied") {
        tracer
          .startSpan(SPAN_SNAPSHOT, {
            attributes: {
              "outpost.customer": seen.customer,
              "outpost.snapshot_id": seen.snapshotId,
              "outpost.cold_until": seen.coldUntil,
              "outpost.snapshot.counted": seen.counted,
              "outpost.meter_ids": seen.meterIds,
              "outpost.local.consumed": seen.localConsumed,
              "outpost.polar.consumed": seen.polarConsumed,
            },
          })
          .end();
      } else if (seen.state === "open") {
        this.reconnection?.end();
        this.reconnection = null;
        this.connection?.end();
        this.connection = tracer.startSpan(SPAN_CONNECTION, { attributes: { "outpost.connections": seen.connections } });
      } else {
        if (seen.reason !== null) this.connection?.setAttribute("outpost.reason", seen.reason);
        this.connection?.end();
        this.connection = null;
        this.reconnection ??= tracer.startSpan(SPAN_RECONNECTION, { attributes: seen.reason === null ? {} : { "outpost.reason": seen.reason } });
      }
    }
  }

  shutdown(): void {
    this.connection?.end();
    this.reconnection?.end();
    this.connection = this.reconnection = null;
  }
}
