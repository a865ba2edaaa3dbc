/** The Express example against a real redis-server and the emulator, in both of Polar's ways:
 * the snapshot protocol, and the public API only (its webhooks through the example's route). */

import assert from "node:assert/strict";
import { type Server, createServer } from "node:http";
import type { Express } from "express";
import { after, before, describe, it } from "node:test";
import { createApp } from "../../examples/express/app.js";
import { Outpost } from "../../src/index.js";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { listenOnLoopback } from "../support/loopback.js";
import { RedisServer } from "../support/redisServer.js";

describe("the Express example", () => {
  let redis: RedisServer;
  let emulator: Emulator;
  let outpost: Outpost;
  let server: Server;
  let base: string;

  before(async () => {
    [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start()]);
    const meter = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
    outpost = new Outpost({ accessToken: emulator.token, serverUrl: emulator.url, redisUrl: redis.url, telemetry: false, logger: { debug: () => {}, warn: () => {} } });
    server = createServer(createApp(outpost, meter));
    base = await listenOnLoopback(server);
    // Credits for one customer: two calls
    await emulator.admin("credits", { meter_id: meter, external_customer_id: "paying", units: 2 });
  });
  after(async () => {
    server.close();
    await outpost.close(5);
    await Promise.all([redis.stop(), emulator.stop()]);
  });

  it("serves while the balance lasts, then answers 402", async () => {
    const get = () => fetch(`${base}/generate`, { headers: { "X-Customer-Id": "paying" } });
    const first = await get();
    assert.equal(first.status, 200);
    assert.deepEqual(await first.json(), { customer: "paying", result: "generated", balance: 1 });
    assert.equal((await get()).status, 200);
    const refused = await get();
    assert.equal(refused.status, 402);
    assert.equal(((await refused.json()) as { consumed: number }).consumed, 2);
  });

  it("refuses a customer without credits, and a request naming no customer", async () => {
    assert.equal((await fetch(`${base}/generate?customer=${uniqueCustomer()}`)).status, 402);
    assert.equal((await fetch(`${base}/generate`)).status, 400);
  });
});

describe("the Express example where Polar serves only its public API", () => {
  let redis: RedisServer;
  let emulator: Emulator;
  let outpost: Outpost;
  let server: Server;
  let base: string;
  let meter: string;

  before(async () => {
    [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start({ publicOnly: true })]);
    meter = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
    // The endpoint's secret comes from Polar when it is registered: the app starts with it.
    let app: Express | null = null;
    server = createServer((request, response) => (app === null ? response.writeHead(503).end() : app(request, response)));
    base = await listenOnLoopback(server);
    const { secret } = (await emulator.admin("webhooks", { url: `${base}/webhooks/polar` })) as { secret: string };
    outpost = new Outpost({ accessToken: emulator.token, serverUrl: emulator.url, redisUrl: redis.url, telemetry: false, webhookSecret: secret, logger: { debug: () => {}, warn: () => {} } });
    app = createApp(outpost, meter);
    await emulator.admin("credits", { meter_id: meter, external_customer_id: "paying", units: 2 });
  });
  after(async () => {
    server.close();
    await outpost.close(5);
    await Promise.all([redis.stop(), emulator.stop()]);
  });

  it("serves while the balance lasts, answers 402, and serves again once a grant's webhook arrives", async () => {
    const get = () => fetch(`${base}/generate`, { headers: { "X-Customer-Id": "paying" } });
    assert.equal((await get()).status, 200);
    assert.equal(outpost.mode, "public");
    assert.equal((await get()).status, 200);
    assert.equal((await get()).status, 402);
    await emulator.admin("credits", { meter_id: meter, external_customer_id: "paying", units: 1 });
    // Only the webhook brings the grant (polls come every 5 minutes).
    await eventually(async () => (await outpost.balance(meter, { externalCustomerId: "paying" })).credited === 3, "the grant's webhook", 20);
    assert.equal((await get()).status, 200);
    const refused = await fetch(`${base}/webhooks/polar`, { method: "POST", body: "{}", headers: { "webhook-id": "msg_x", "webhook-timestamp": "1", "webhook-signature": "v1,AAAA" } });
    assert.equal(refused.status, 401);
  });
});
