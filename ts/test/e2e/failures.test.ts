/** What an instance does when what it talks to is down or wrong, as the Python SDK does: a call
 * that needs Redis fails at once with the cause named; each loop says an outage began once (a
 * reminder a minute) and that it ended at INFO; close() returns within its timeout whatever is
 * down, the last telemetry export failing quietly. The close bounds are on a behaviour (an
 * exporter or a reconnecting client holding close() for tens of seconds), with a margin. */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer as createHttpsServer } from "node:https";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { allOutboxes } from "../../src/core/index.js";
import { NotReady, Outpost, type OutpostOptions, RedisUnavailable } from "../../src/index.js";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { rejection, untilTrackWorks } from "../support/failing.js";
import { Lines } from "../support/lines.js";
import { listenOnLoopback } from "../support/loopback.js";
import { RedisServer, freePort } from "../support/redisServer.js";
import { sharedEmulator } from "../support/sharedEmulator.js";
import { testOptions } from "../support/testOptions.js";

const MARGIN = 1.0; // seconds over close()'s timeout allowed for this shared, loaded machine
const CLIENT_WORDS = /maxRetriesPerRequest|enableOfflineQueue|ioredis|MaxRetriesPerRequestError/;

async function closeTaking(outpost: Outpost, timeout: number): Promise<number> {
  const started = performance.now();
  await outpost.close(timeout);
  return (performance.now() - started) / 1000;
}

async function queued(redis: RedisServer): Promise<number> {
  const client = redis.client();
  let total = 0;
  for (const stream of allOutboxes()) total += await client.xlen(stream);
  return total;
}

describe("failures", () => {
  const shared = sharedEmulator();

  it("with Redis at a closed port, track() rejects naming the refused connection, and a first read's NotReady names it", async () => {
    const lines = new Lines();
    const port = await freePort();
    const outpost = new Outpost({
      accessToken: shared.emulator.token,
      serverUrl: shared.emulator.url,
      redisUrl: `redis://127.0.0.1:${port}/0`,
      telemetry: false,
      snapshotTimeout: 1,
      logger: lines.logger,
    });
    try {
      const tracked = await rejection(outpost.track("api_call", { externalCustomerId: "c1" }));
      assert.ok(tracked instanceof RedisUnavailable, String(tracked));
      assert.match(tracked.message, new RegExp(`127\\.0\\.0\\.1:${port}: connection refused`));
      assert.doesNotMatch(tracked.message, CLIENT_WORDS);
      const read = await rejection(outpost.balance(shared.calls, { externalCustomerId: "c1" }));
      assert.ok(read instanceof NotReady, String(read));
      assert.match(read.message, /could not be loaded from Redis.*connection refused/);
    } finally {
      await outpost.close(2);
    }
    const warnings = lines.at("warn");
    assert.ok(warnings.length >= 1 && warnings.length <= 5, JSON.stringify(warnings));
    for (const line of lines.lines) assert.doesNotMatch(line.message, CLIENT_WORDS);
  });

  it("Redis down and back: calls fail meanwhile, each loop says so once, then everything resumes and says so at INFO", async () => {
    const redis = await RedisServer.start(true);
    const lines = new Lines();
    const customer = uniqueCustomer();
    const outpost = new Outpost(testOptions(shared.emulator, redis, { logger: lines.logger, retryBase: 0.05 }));
    try {
      await shared.emulator.admin("credits", { meter_id: shared.calls, external_customer_id: customer, units: 100 });
      await outpost.track("api_call", { externalCustomerId: customer });
      assert.equal((await outpost.balance(shared.calls, { externalCustomerId: customer })).consumed, 1);
      assert.equal(await outpost.flush(10), true);
      await redis.halt();
      // Every call fails with RedisUnavailable; once the connection's first attempt to reconnect
      // failed (until then the connection only closed), the message names the cause.
      await eventually(async () => {
        const tracked = await rejection(outpost.track("api_call", { externalCustomerId: customer }));
        assert.ok(tracked instanceof RedisUnavailable, String(tracked));
        return /connection refused/.test(tracked.message);
      }, "track() naming the refused connection");
      const flushed = await rejection(outpost.flush(1));
      assert.ok(flushed instanceof RedisUnavailable && /connection refused/.test(flushed.message), String(flushed));
      // Polar pushes a snapshot the instance cannot apply: its flow backs off, it does not spin.
      await shared.emulator.admin("credits", { meter_id: shared.calls, external_customer_id: customer, units: 5 });
      await eventually(() => ["the change subscription", "delivery 0"].every((what) => lines.at("warn").some((l) => l.includes(what))), "the subscription and delivery saying Redis is down");
      const down = lines.at("warn");
      // One line per loop that met the outage, none repeated within a minute.
      assert.ok(down.length <= 5, JSON.stringify(down));
      assert.equal(new Set(down).size, down.length, JSON.stringify(down));
      await redis.start();
      await untilTrackWorks(outpost, customer, "track() working again");
      await eventually(
        async () => {
          const found = await outpost.balance(shared.calls, { externalCustomerId: customer });
          return found.credited === 105 && found.consumed === 2 && found.source === "memory";
        },
        "reads exact and warm again",
        20,
      );
      assert.equal(await outpost.flush(20), true);
      assert.equal((await shared.emulator.customerMeter(shared.calls, customer)).consumed_units, 2);
      assert.ok(lines.at("info").some((l) => l.includes("Redis is back")), JSON.stringify(lines.at("info")));
      for (const line of lines.lines) assert.doesNotMatch(line.message, CLIENT_WORDS);
    } finally {
      await outpost.close(2);
      await redis.stop();
    }
  });

  it("a refused token is named in NotReady, and said once at ERROR", async () => {
    const redis = await RedisServer.start();
    const lines = new Lines();
    const outpost = new Outpost(testOptions(shared.emulator, redis, { accessToken: "polar_oat_wrong", snapshotTimeout: 1, logger: lines.logger }));
    try {
      const read = await rejection(outpost.balance(shared.calls, { externalCustomerId: "c1" }));
      assert.ok(read instanceof NotReady);
      assert.match(read.message, /no configuration from Polar yet.*HTTP 401/);
      const tracked = await rejection(outpost.track("api_call", { externalCustomerId: "c1" }));
      assert.ok(tracked instanceof NotReady);
      assert.match(tracked.message, /HTTP 401/);
      const said = lines.at("error").filter((l) => /HTTP 401/.test(l));
      assert.equal(said.length, 1, lines.text);
      assert.ok(!lines.at("warn").some((l) => /HTTP 401/.test(l)), lines.text);
    } finally {
      await outpost.close(2);
      await redis.stop();
    }
  });

  it("a server URL where nothing listens is named in NotReady", async () => {
    const redis = await RedisServer.start();
    const outpost = new Outpost(testOptions(shared.emulator, redis, { serverUrl: `http://127.0.0.1:${await freePort()}`, snapshotTimeout: 1 }));
    try {
      const read = await rejection(outpost.balance("m", { externalCustomerId: "c1" }));
      assert.ok(read instanceof NotReady);
      assert.match(read.message, /no configuration from Polar yet.*cannot connect to 127\.0\.0\.1:\d+: connection refused/);
    } finally {
      await outpost.close(2);
      await redis.stop();
    }
  });

  it("an ingestion endpoint whose TLS certificate does not verify stalls delivery, named at ERROR: no retry fixes it, and nothing is dropped (as Python)", async () => {
    const redis = await RedisServer.start();
    const files = mkdtempSync(join(tmpdir(), "outpost-ts-ingest-tls-"));
    const certificate = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"];
    execFileSync("openssl", [...certificate, "-keyout", join(files, "key.pem"), "-out", join(files, "cert.pem")], { stdio: "ignore" });
    const untrusted = createHttpsServer({ key: readFileSync(join(files, "key.pem")), cert: readFileSync(join(files, "cert.pem")) }, (_, response) => {
      response.writeHead(200).end("{}");
    });
    const url = (await listenOnLoopback(untrusted)).replace("http://", "https://");
    // A configuration cached in Redis by an instance that talked to the shared emulator.
    const seeding = new Outpost(testOptions(shared.emulator, redis));
    await seeding.balance(shared.calls, { externalCustomerId: "c1" });
    await seeding.close(2);
    const lines = new Lines();
    const dropped: unknown[] = [];
    const options: OutpostOptions = { serverUrl: url, linger: 0.01, retryBase: 0.01, maxAttempts: 2, logger: lines.logger, onDropped: (events) => dropped.push(...events) };
    const outpost = new Outpost(testOptions(shared.emulator, redis, options));
    try {
      await outpost.track("api_call", { externalCustomerId: "c1" });
      await eventually(() => outpost.deliveryStalled !== null, "delivery stalled on the certificate");
      assert.match(outpost.deliveryStalled ?? "", /TLS certificate of 127\.0\.0\.1 did not verify/);
      assert.ok(lines.at("error").some((l) => l.includes("TLS certificate of 127.0.0.1 did not verify")), lines.text);
      await outpost.close(0.5);
      assert.deepEqual(dropped, []);
      assert.equal(await queued(redis), 1);
    } finally {
      await outpost.close(0.5);
      untrusted.closeAllConnections();
      untrusted.close();
      rmSync(files, { recursive: true, force: true });
      await redis.stop();
    }
  });

  it("an https:// server URL where the server speaks no TLS is Polar unreachable: delivery waits, using no attempt, and drops nothing (as Python)", async () => {
    const redis = await RedisServer.start();
    let connections = 0;
    const plain: Server = createServer((socket) => {
      connections += 1;
      socket.end("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
    });
    const url = (await listenOnLoopback(plain)).replace("http://", "https://");
    const seeding = new Outpost(testOptions(shared.emulator, redis));
    await seeding.balance(shared.calls, { externalCustomerId: "c1" });
    await seeding.close(2);
    const dropped: unknown[] = [];
    const options: OutpostOptions = { serverUrl: url, linger: 0.01, retryBase: 0.01, maxAttempts: 2, onDropped: (events) => dropped.push(...events) };
    const outpost = new Outpost(testOptions(shared.emulator, redis, options));
    try {
      await outpost.track("api_call", { externalCustomerId: "c1" });
      // The WebSocket's attempts connect too: past max_attempts ingestion requests, twice over.
      await eventually(() => connections >= 8, "ingestion requests tried again and again", 20);
      assert.deepEqual(dropped, []);
      await outpost.close(0.5);
      assert.equal(await queued(redis), 1);
    } finally {
      await outpost.close(0.5);
      plain.close();
      await redis.stop();
    }
  });

  describe("close() returns within its timeout", () => {
    /** An instance with telemetry exported to the relay, warm, with three events queued that
     * nothing will deliver once `down` is down. */
    async function withThreeQueued(down: "polar" | "redis" | "both", lines: Lines): Promise<[Outpost, RedisServer, Emulator]> {
      const [redis, polar] = await Promise.all([RedisServer.start(), Emulator.start()]);
      const meter = await polar.createMeter("calls", CALLS_FILTER, { func: "count" });
      const options: OutpostOptions = { telemetry: true, telemetryInterval: 0.2, logger: lines.logger };
      const outpost = new Outpost(testOptions(polar, redis, options));
      await outpost.balance(meter, { externalCustomerId: "c1" });
      await eventually(async () => (await polar.admin("telemetry")).metrics.length > 0, "an export to the relay");
      if (down !== "redis") await polar.stop();
      for (let i = 0; i < 3; i++) await outpost.track("api_call", { externalCustomerId: "c1" });
      if (down !== "polar") await redis.halt();
      return [outpost, redis, polar];
    }

    for (const timeout of [1, 2]) {
      it(`with Polar down (close(${timeout})), its last export failing in one DEBUG line, what is queued left in Redis`, async () => {
        const lines = new Lines();
        const [outpost, redis, polar] = await withThreeQueued("polar", lines);
        try {
          lines.lines.length = 0;
          const took = await closeTaking(outpost, timeout);
          assert.ok(took < timeout + MARGIN, `close(${timeout}) took ${took.toFixed(2)} s`);
          // The WebSocket's failed reconnection may begin its outage report meanwhile; nothing else warns.
          assert.deepEqual(lines.at("warn").filter((l) => !l.startsWith("outpost: Polar unreachable for the WebSocket")), []);
          const atClose = lines.at("debug").filter((l) => l.includes("last export failed at close"));
          assert.equal(atClose.length, 1, JSON.stringify(lines.lines));
          assert.equal(await queued(redis), 3);
        } finally {
          await Promise.all([redis.stop(), polar.stop()]);
        }
      });
    }

    for (const down of ["redis", "both"] as const) {
      it(`with ${down === "both" ? "Polar and Redis" : "Redis"} down`, async () => {
        const lines = new Lines();
        const [outpost, redis, polar] = await withThreeQueued(down, lines);
        try {
          const took = await closeTaking(outpost, 2);
          assert.ok(took < 2 + MARGIN, `close(2) took ${took.toFixed(2)} s`);
          for (const line of lines.lines) assert.doesNotMatch(line.message, CLIENT_WORDS);
        } finally {
          await Promise.all([redis.stop(), polar.stop()]);
        }
      });
    }

    it("with Polar never answering the WebSocket's upgrade nor an ingestion request", async () => {
      const redis = await RedisServer.start();
      const held: Socket[] = [];
      const silent: Server = createServer((socket) => held.push(socket));
      const url = await listenOnLoopback(silent);
      // A configuration cached in Redis by an instance that talked to the shared.emulator.
      const seeding = new Outpost(testOptions(shared.emulator, redis));
      await seeding.balance(shared.calls, { externalCustomerId: "c1" });
      await seeding.close(2);
      const outpost = new Outpost(testOptions(shared.emulator, redis, { serverUrl: url, linger: 0.01 }));
      try {
        await outpost.track("api_call", { externalCustomerId: "c1" });
        await eventually(() => held.length >= 2, "the WebSocket and a delivery waiting on Polar");
        const took = await closeTaking(outpost, 1);
        assert.ok(took < 1 + MARGIN, `close(1) took ${took.toFixed(2)} s`);
      } finally {
        for (const socket of held) socket.destroy();
        silent.close();
        await redis.stop();
      }
    });
  });
});
