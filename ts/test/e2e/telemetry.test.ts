/** Telemetry reaches Polar's relay, and the application's OpenTelemetry providers when it asks
 * (`telemetryToApp`), with the shared names; an interval admits a bounded number of series. */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { metrics, trace } from "@opentelemetry/api";
import { AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { DURATION_BOUNDARIES, SERIES_LEFT_OUT, Telemetry } from "../../src/driver/telemetry.js";
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
    const options = {
      accessToken: emulator.token,
      serverUrl: emulator.url,
      redisUrl: redis.url,
      telemetryToApp: true,
      logger: { debug: () => {}, warn: () => {} },
    };
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

  it("records each admission with its operation and outcome", async () => {
    // Its own event name: an event counts in every meter whose filter it matches, and admission
    // checks them all (the earlier tests' meters have no credits for a1).
    const filter = { conjunction: "and", clauses: [{ property: "name", operator: "eq", value: "admitted_call" }] };
    const calls = await emulator.createMeter("admitted", filter, { func: "count" });
    await emulator.admin("credits", { meter_id: calls, units: 2, external_customer_id: "a1" });
    const outpost = new Outpost({ accessToken: emulator.token, serverUrl: emulator.url, redisUrl: redis.url, telemetryToApp: true, logger: { debug: () => {}, warn: () => {} } });
    try {
      await (await outpost.reserve(calls, 1, { externalCustomerId: "a1" })).release();
      await (await outpost.reserve(calls, 1, { externalCustomerId: "a1" })).commit("admitted_call");
      await outpost.track("admitted_call", { externalCustomerId: "a1", requireBalance: true });
      await assert.rejects(outpost.reserve(calls, 1, { externalCustomerId: "a1" }), { name: "InsufficientBalance" });
      await assert.rejects(outpost.track("admitted_call", { externalCustomerId: "a1", requireBalance: true }), { name: "InsufficientBalance" });
    } finally {
      await outpost.close(5);
    }
    await reader.forceFlush();
    const points = exported
      .getMetrics()
      .flatMap((m) => m.scopeMetrics.flatMap((s) => s.metrics))
      .filter((m) => m.descriptor.name === "outpost.admission.duration")
      .flatMap((m) => m.dataPoints.map((p) => p.attributes))
      .filter((a) => a["outpost.customer"] === "external:a1");
    const seen = new Set(points.map((a) => `${a["outpost.admission.operation"]} ${a["outpost.outcome"]}`));
    assert.deepEqual(seen, new Set(["reserve ok", "release ok", "commit ok", "track ok", "reserve insufficient_balance", "track insufficient_balance"]));
    assert.deepEqual(new Set(points.map((a) => a["outpost.meter_id"])), new Set([calls]));
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
    await outpost.close(5); // sends what the span processor holds (close waits for it 0.75 s at most)
    await eventually(async () => (await emulator.admin("telemetry")).traces.length > 0, "a traces export to the relay");
    const stored = await emulator.admin("telemetry");
    const body = Buffer.from(stored.metrics[0].body_base64, "base64").toString("latin1");
    assert.ok(body.includes("outpost.ingest.duration") || body.includes("outpost.read.duration"), "the shared metric names");
    assert.ok(body.includes("outpost-node"));
    const relayed = stored.metrics.map((m: { body_base64: string }) => Buffer.from(m.body_base64, "base64").toString("latin1")).join("");
    assert.ok(relayed.includes("external:r1"), "the customer, named at the relay");
    // Without telemetryToApp, the application's providers get none of it.
    await reader.forceFlush();
    assert.ok(!JSON.stringify(exported.getMetrics()).includes("external:r1"));
    assert.ok(!JSON.stringify(spans.getFinishedSpans().map((s) => s.attributes)).includes("external:r1"));
  });

  it("admits at most the cap of series per instrument in an interval, and counts the rest", async () => {
    const debug: string[] = [];
    const telemetry = new Telemetry(true, { url: null, token: null, interval: 30, toApp: true, seriesCap: 2 }, () => {}, (m) => debug.push(m));
    for (const customer of ["cap-a", "cap-b", "cap-c"]) telemetry.tracked(`external:${customer}`, ["m"], 0.001, "ok", 0);
    telemetry.tracked("external:cap-a", ["m"], 0.001, "ok", 0); // a series already admitted: kept
    await telemetry.flush(0, 0, 0);
    telemetry.tracked("external:cap-d", ["m"], 0.001, "ok", 0); // still beyond the cap
    await telemetry.flush(31, 0, 0); // ends the interval
    telemetry.tracked("external:cap-c", ["m"], 0.001, "ok", 0); // a new interval: admitted
    await telemetry.flush(32, 0, 0);
    assert.deepEqual(debug, ["outpost telemetry: 2 records of this interval left out (more than 2 series per instrument)"]);
    await reader.forceFlush();
    const recorded = exported.getMetrics().flatMap((m) => m.scopeMetrics.flatMap((s) => s.metrics));
    type Point = { attributes: Record<string, unknown>; value: unknown };
    const points = (name: string): Point[] => recorded.filter((m) => m.descriptor.name === name).flatMap((m) => m.dataPoints as Point[]);
    const ingest = points("outpost.ingest.duration");
    const counts = new Map<unknown, number>();
    for (const p of ingest) {
      const customer = p.attributes["outpost.customer"];
      if (String(customer).startsWith("external:cap-")) counts.set(customer, (p.value as { count: number }).count);
    }
    assert.deepEqual(counts, new Map([["external:cap-a", 2], ["external:cap-b", 1], ["external:cap-c", 1]]));
    const leftOut = points(SERIES_LEFT_OUT);
    assert.ok(leftOut.some((p) => p.value === 2));
  });
});
