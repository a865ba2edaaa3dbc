/** Telemetry through @opentelemetry/api, with the names both SDKs share (outpost_core/semconv.py).
 * Without an SDK registered by the application, the API's no-op meter records nothing. Never an
 * event's metadata, never the token. */

import { type Counter, type Histogram, metrics } from "@opentelemetry/api";
import type { Observation } from "../core/observations.js";

export const INGEST_DURATION = "outpost.ingest.duration";
export const READ_DURATION = "outpost.read.duration";
export const BUCKETS_WRITTEN = "outpost.buckets.written";
export const SNAPSHOTS_APPLIED = "outpost.syncs.applied";

export class Telemetry {
  private readonly ingest: Histogram | null;
  private readonly read: Histogram | null;
  private readonly buckets: Counter | null;
  private readonly snapshots: Counter | null;

  constructor(readonly enabled: boolean) {
    const meter = enabled ? metrics.getMeter("outpost", "0.1.0") : null;
    this.ingest = meter?.createHistogram(INGEST_DURATION, { unit: "s" }) ?? null;
    this.read = meter?.createHistogram(READ_DURATION, { unit: "s" }) ?? null;
    this.buckets = meter?.createCounter(BUCKETS_WRITTEN) ?? null;
    this.snapshots = meter?.createCounter(SNAPSHOTS_APPLIED) ?? null;
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
    for (const seen of observations) {
      if (seen.kind === "SnapshotApplied") this.snapshots?.add(1, { "outpost.customer": seen.customer });
    }
  }
}
