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

/** The example on loopback against a fresh Redis and emulator (`publicOnly`: Polar serves only its
 * public API, and the example's webhook route is registered with it), its meter counting calls,
 * with credits for one customer, "paying": two calls. Started before the suite, stopped after. */
function servedExample(publicOnly: boolean): Served {
  const served = {} as Served;
  before(async () => {
    const [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start({ publicOnly })]);
    Object.assign(served, { redis, emulator });
    const meter = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
    served.meter = meter;
    // The endpoint's secret comes from Polar when it is registered: the app starts with it.
    let app: Express | null = null;
    served.server = createServer((request, response) => (app === null ? response.writeHead(503).end() : app(request, response)));
    served.base = await listenOnLoopback(served.server);
    const webhooks = publicOnly ? ((await emulator.admin("webhooks", { url: `${served.base}/webhooks/polar` })) as { secret: string }) : null;
    served.outpost = new Outpost({ accessToken: emulator.token, serverUrl: emulator.url, redisUrl: redis.url, telemetry: false, webhookSecret: webhooks?.secret, logger: { debug: () => {}, warn: () => {} } });
    app = createApp(served.outpost, meter);
    await emulator.admin("credits", { meter_id: meter, external_customer_id: "paying", units: 2 });
  });
  after(async () => {
    served.server.close();
    await served.outpost.close(5);
    await Promise.all([served.redis.stop(), served.emulator.stop()]);
  });
  return served;
}

interface Served {
  redis: RedisServer;
  emulator: Emulator;
  outpost: Outpost;
  server: Server;
  base: string;
  meter: string;
}

describe("the Express example", () => {
  const served = servedExample(false);

  it("serves while the balance lasts, then answers 402", async () => {
    const get = () => fetch(`${served.base}/generate`, { headers: { "X-Customer-Id": "paying" } });
    const first = await get();
    assert.equal(first.status, 200);
    assert.deepEqual(await first.json(), { customer: "paying", result: "generated", balance: 1 });
    assert.equal((await get()).status, 200);
    const refused = await get();
    assert.equal(refused.status, 402);
    assert.equal(((await refused.json()) as { consumed: number }).consumed, 2);
  });

  it("refuses a customer without credits, and a request naming no customer", async () => {
    assert.equal((await fetch(`${served.base}/generate?customer=${uniqueCustomer()}`)).status, 402);
    assert.equal((await fetch(`${served.base}/generate`)).status, 400);
  });
});

describe("the Express example where Polar serves only its public API", () => {
  const served = servedExample(true);

  it("serves while the balance lasts, answers 402, and serves again once a grant's webhook arrives", async () => {
    const get = () => fetch(`${served.base}/generate`, { headers: { "X-Customer-Id": "paying" } });
    assert.equal((await get()).status, 200);
    assert.equal(served.outpost.mode, "public");
    assert.equal((await get()).status, 200);
    assert.equal((await get()).status, 402);
    await served.emulator.admin("credits", { meter_id: served.meter, external_customer_id: "paying", units: 1 });
    // Only the webhook brings the grant (polls come every 5 minutes).
    await eventually(async () => (await served.outpost.balance(served.meter, { externalCustomerId: "paying" })).credited === 3, "the grant's webhook", 20);
    assert.equal((await get()).status, 200);
    const refused = await fetch(`${served.base}/webhooks/polar`, { method: "POST", body: "{}", headers: { "webhook-id": "msg_x", "webhook-timestamp": "1", "webhook-signature": "v1,AAAA" } });
    assert.equal(refused.status, 401);
  });
});
