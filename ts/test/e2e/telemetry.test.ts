/** Telemetry reaches the application's OpenTelemetry providers, with the shared names. */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { metrics, trace } from "@opentelemetry/api";
import { AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { DURATION_BOUNDARIES } from "../../src/driver/telemetry.js";
import { Outpost } from "../../src/index.js";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { eventually } from "../support/eventually.js";
import { RedisServer } from "../support/redisServer.js";

describe("telemetry", () => {
  let redis: RedisServer;
  let emulator: Emulator;
  const spans = new InMemorySpanExporter();
  const exported = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter: exported, exportIntervalMillis: 3_600_000 });

  before(async () => {
    trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] }));
    metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));
    [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start()]);
  });
  after(async () => Promise.all([redis.stop(), emulator.stop()]));

  it("records writes, reads, snapshots and connections; nothing with telemetry: false", async () => {
    const calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
    const options = { accessToken: emulator.token, serverUrl: emulator.url, redisUrl: redis.url, logger: { debug: () => {}, warn: () => {} } };
    const quiet = new Outpost({ ...options, telemetry: false });
    await quiet.balance(calls, { externalCustomerId: "q" });
    await quiet.close(5);
    assert.equal(spans.getFinishedSpans().length, 0);

    const outpost = new Outpost(options);
    await outpost.balance(calls, { externalCustomerId: "t1" });
    await outpost.track("api_call", { externalCustomerId: "t1", metadata: { secret: "never recorded" } });
    await outpost.balance(calls, { externalCustomerId: "t1" }); // computed again after the write
    await outpost.balance(calls, { externalCustomerId: "t1" }); // warm: the cached answer
    await emulator.admin("faults", { drop_websockets: "close" });
    await eventually(() => spans.getFinishedSpans().some((s) => s.name === "outpost.connection"), "the connection span to end");
    await eventually(() => outpost.connected, "the reconnection");
    await outpost.close(5);

    const names = spans.getFinishedSpans().map((s) => s.name);
    assert.ok(names.includes("outpost.snapshot.received"));
    assert.ok(names.includes("outpost.reconnection"));
    assert.ok(names.includes("outpost.syncs"));
    const snapshot = spans.getFinishedSpans().find((s) => s.name === "outpost.snapshot.received");
    assert.equal(snapshot?.attributes["outpost.customer"], "external:t1");
    await reader.forceFlush();
    const recorded = exported.getMetrics().flatMap((m) => m.scopeMetrics.flatMap((s) => s.metrics));
    const byName = new Map(recorded.map((m) => [m.descriptor.name, m]));
    for (const name of ["outpost.ingest.duration", "outpost.read.duration", "outpost.read.warm", "outpost.buckets.written"]) assert.ok(byName.has(name), name);
    const outcomes = byName.get("outpost.read.duration")?.dataPoints.map((p) => p.attributes["outpost.outcome"]);
    assert.deepEqual(new Set(outcomes), new Set(["cold"])); // a warm read is counted, not timed
    const warm = byName.get("outpost.read.warm")?.dataPoints.map((p) => [p.attributes["outpost.meter_id"], p.attributes["outpost.customer"], p.value]);
    assert.deepEqual(warm, [[calls, "external:t1", 1]]);
    const ingest = byName.get("outpost.ingest.duration")?.dataPoints.map((p) => p.attributes);
    assert.deepEqual(ingest?.map((a) => [a["outpost.customer"], a["outpost.meter_id"], a["outpost.outcome"]]), [["external:t1", calls, "ok"]]);
    // Durations in seconds, in buckets of 0.1 ms to 1 s (not OpenTelemetry's 0-5-10-...).
    for (const name of ["outpost.ingest.duration", "outpost.read.duration"]) {
      for (const point of byName.get(name)?.dataPoints ?? []) {
        assert.deepEqual((point.value as { buckets: { boundaries: number[] } }).buckets.boundaries, [...DURATION_BOUNDARIES], name);
      }
    }
    assert.ok(!JSON.stringify(recorded).includes("never recorded"));
    assert.ok(!JSON.stringify(spans.getFinishedSpans().map((s) => s.attributes)).includes(emulator.token));
  });

  it("exports to Polar's relay with the token, once the organization is known", async () => {
    const calls = await emulator.createMeter("relayed", CALLS_FILTER, { func: "count" });
    const outpost = new Outpost({
      accessToken: emulator.token,
      serverUrl: emulator.url,
      redisUrl: redis.url,
      telemetryInterval: 0.2,
      logger: { debug: () => {}, warn: () => {} },
    });
    await outpost.balance(calls, { externalCustomerId: "r1" });
    await outpost.track("api_call", { externalCustomerId: "r1" });
    await eventually(async () => (await emulator.admin("telemetry")).metrics.length > 0, "a metrics export to the relay");
    await outpost.close(5); // sends what the span processor holds
    const stored = await emulator.admin("telemetry");
    assert.ok(stored.traces.length > 0, "a traces export to the relay");
    const body = Buffer.from(stored.metrics[0].body_base64, "base64").toString("latin1");
    assert.ok(body.includes("outpost.ingest.duration") || body.includes("outpost.read.duration"), "the shared metric names");
    assert.ok(body.includes("outpost-node"));
  });
});
