/** The public-API mode against the emulator serving Polar's public API only (`outpost emulator
 * --public-only`, no /v1/outpost/) and a real redis-server: the mode found from the 404, the
 * configuration from /v1/meters/, a first read anchored at once, events counted until Polar's
 * figure provably includes them, figures brought by polls and by signed webhooks (each taken
 * once for the fleet), instances sharing the anchors through Redis. */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { after, afterEach, before, describe, it } from "node:test";
import { Redis } from "ioredis";
import { CONFIGURATION_KEY, Customer, stateKey } from "../../src/core/index.js";
import { sign, secretKey } from "../../src/core/webhookSignature.js";
import { ConfigurationError, InvalidWebhook, NotReady, Outpost, type OutpostOptions, RedisUnavailable } from "../../src/index.js";
import { CALLS_FILTER, Emulator, PYTHON } from "../support/emulator.js";
import { PythonPeer } from "../support/pythonPeer.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { RedisServer, freePort } from "../support/redisServer.js";
import { testOptions } from "../support/testOptions.js";
import { endpoint } from "../support/webhookEndpoint.js";
import { Lines } from "../support/lines.js";

describe("the public-API mode", () => {
  let redis: RedisServer;
  let emulator: Emulator;
  let calls: string;
  /** An avg, a min and a sum meter, by aggregation. */
  const meters = new Map<string, string>();
  let probe: Redis;
  const open: Outpost[] = [];

  before(async () => {
    [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start({ publicOnly: true, recomputeDelays: [0.2, 3600] })]);
    calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
    for (const func of ["avg", "min", "sum"]) meters.set(func, await emulator.createMeter(`latency-${func}`, CALLS_FILTER, { func, property: "ms" }));
    probe = redis.client();
  });
  afterEach(async () => {
    await Promise.allSettled(open.splice(0).map((o) => o.close(2)));
  });
  after(async () => Promise.all([redis.stop(), emulator.stop()]));

  function connect(options: OutpostOptions = {}): Outpost {
    // margin 0: the emulator's clock is this machine's, and it stamps a recompute after reading
    const outpost = new Outpost(testOptions(emulator, redis, { publicMargin: 0, ...options }));
    open.push(outpost);
    return outpost;
  }

  it("finds the public API from the 404 on /v1/outpost/, reads a first balance at once, and counts events until Polar's figure includes them", async () => {
    const a = connect({ pollInterval: 0.5 });
    const customer = uniqueCustomer("pub");
    const who = { externalCustomerId: customer };
    await emulator.admin("credits", { meter_id: calls, units: 5, external_customer_id: customer });
    const first = await a.balance(calls, who);
    assert.deepEqual([first.credited, first.consumed, first.balance], [5, 0, 5]);
    assert.equal(a.mode, "public");
    assert.match(a.modeReason, /404/);
    // The configuration is the public mode's, cached for the fleet.
    assert.equal(JSON.parse((await probe.get(CONFIGURATION_KEY)) as string).mode, "public");
    await a.track("api_call", who);
    await a.track("api_call", who);
    assert.equal((await a.balance(calls, who)).consumed, 2); // at once, before Polar counts them
    assert.equal(await a.flush(10), true);
    // Polar recomputes, a poll brings its figure, and the events it includes leave the ledger.
    const state = stateKey(new Customer("external", customer), calls);
    await eventually(async () => (await probe.hget(state, "n")) === "0", "the events Polar counted to leave the ledger", 20);
    const read = await a.balance(calls, { ...who, fresh: true });
    assert.deepEqual([read.credited, read.consumed, read.balance], [5, 2, 3]);
    assert.equal((await emulator.customerMeter(calls, customer)).consumed_units, 2);
  });

  it("relays an avg or min meter's figure marked approximate", async () => {
    const a = connect({ mode: "public" });
    for (const [func, approximate] of [["avg", true], ["min", true], ["sum", false]] as [string, boolean][]) {
      const meter = meters.get(func) as string;
      const customer = uniqueCustomer("ms");
      await emulator.admin("credits", { meter_id: meter, units: 100, external_customer_id: customer });
      const first = await a.balance(meter, { externalCustomerId: customer });
      assert.deepEqual([first.credited, first.approximate], [100, approximate]);
      await a.track("api_call", { externalCustomerId: customer, metadata: { ms: 7 } });
      const again = await a.balance(meter, { externalCustomerId: customer, fresh: true });
      assert.deepEqual([again.approximate, again.source], [approximate, "redis"]);
    }
  });

  it("polls a customer named only by Polar's customer id by that id", async () => {
    const a = connect({ mode: "public", pollInterval: 0.5 });
    const { id } = (await emulator.admin("customers", { external_id: null })) as { id: string };
    await emulator.admin("credits", { meter_id: calls, units: 10, customer_id: id });
    const who = { customerId: id };
    assert.deepEqual([(await a.balance(calls, who)).credited, (await a.balance(calls, who)).balance], [10, 10]); // no webhook: a poll answers
    for (let i = 0; i < 3; i++) await a.track("api_call", who);
    assert.equal((await a.balance(calls, who)).balance, 7);
    assert.equal(await a.flush(10), true);
    await eventually(async () => {
      const read = await a.balance(calls, who);
      return read.balance === 7 && read.pending === 0; // Polar's figure, by the polls
    }, "the polls bringing Polar's figure", 20);
    assert.equal((await a.balance(calls, { customerId: "00000000-0000-4000-8000-000000000000" })).credited, 0);
  });

  it("a customer Polar has no row for reads nothing credited, nothing consumed", async () => {
    const a = connect({ mode: "public" });
    const read = await a.balance(calls, { externalCustomerId: uniqueCustomer("nobody") });
    assert.deepEqual([read.credited, read.consumed, read.balance], [0, 0, 0]);
    assert.equal(a.modeReason, 'mode="public" was asked');
  });

  it("applies the figures of signed webhooks, each delivery once for the fleet; refuses a bad signature", async () => {
    let current: Outpost | null = null;
    const [server, url, seen] = await endpoint(() => current);
    try {
      const { secret } = (await emulator.admin("webhooks", { url })) as { secret: string };
      const a = connect({ mode: "public", webhookSecret: secret }); // polls every 300 s: only webhooks bring news
      const b = connect({ mode: "public", webhookSecret: secret });
      current = a;
      const customer = uniqueCustomer("hook");
      const who = { externalCustomerId: customer };
      await emulator.admin("credits", { meter_id: calls, units: 1, external_customer_id: customer });
      assert.equal((await a.balance(calls, who)).credited, 1);
      assert.equal((await b.balance(calls, who)).credited, 1);
      await emulator.admin("credits", { meter_id: calls, units: 4, external_customer_id: customer });
      await eventually(async () => (await b.balance(calls, who)).credited === 5, "b hearing the grant a's webhook applied", 20);
      assert.equal((await a.balance(calls, who)).credited, 5);
      // (b hears the figure as soon as a's script applied it; a answers the delivery after that.)
      await eventually(() => seen.statuses.includes(204), `a answering the delivery 204 (answered: ${seen.statuses.join(", ") || "nothing yet"})`, 20);
      // The same delivery again (Polar's retry, to the other instance): taken already.
      const deliveries = (await emulator.admin("webhooks")) as { deliveries?: unknown[] };
      assert.ok(deliveries !== null);
      const key = secretKey(secret);
      const body = Buffer.from(JSON.stringify({ type: "customer.state_changed", timestamp: new Date().toISOString(), data: { id: "x", external_id: customer, active_meters: [] } }));
      const stamp = Math.floor(Date.now() / 1000);
      const headers = { "webhook-id": "msg_twice", "webhook-timestamp": String(stamp), "webhook-signature": sign(key, "msg_twice", stamp, body) };
      assert.equal(await a.handleWebhook(body, headers), 204);
      assert.equal(await b.handleWebhook(body, headers), 204);
      await assert.rejects(a.handleWebhook(body, { ...headers, "webhook-signature": "v1,AAAA" }), InvalidWebhook);
      assert.equal(a.rejections.webhook, 1);
    } finally {
      server.close();
    }
  });

  it("figures applied while tracks land: every event still counts once (the anchor's compare-and-set retries)", async () => {
    const secret = "whsec_" + Buffer.from("a test secret of the public mode").toString("base64");
    const a = connect({ mode: "public", webhookSecret: secret });
    const customer = uniqueCustomer("race");
    const who = { externalCustomerId: customer };
    assert.equal((await a.balance(calls, who)).credited, 0);
    const key = secretKey(secret);
    const base = Date.now() - 3_600_000; // an hour ago: before every acknowledgement, so nothing is pruned
    const figure = (n: number): [Buffer, Record<string, string>] => {
      const modified = new Date(base + n * 1000).toISOString();
      const meter = { id: `row-${n}`, meter_id: calls, consumed_units: 0, credited_units: 100 + n, balance: 100 + n, modified_at: modified };
      const body = Buffer.from(JSON.stringify({ type: "customer.state_changed", data: { id: "polar-id", external_id: customer, active_meters: [meter] } }));
      const stamp = Math.floor(Date.now() / 1000);
      return [body, { "webhook-id": `msg_${customer}_${n}`, "webhook-timestamp": String(stamp), "webhook-signature": sign(key, `msg_${customer}_${n}`, stamp, body) }];
    };
    const TRACKS = 40;
    const tracking = (async () => {
      for (let n = 0; n < TRACKS; n++) await a.track("api_call", who);
    })();
    const figures = Array.from({ length: 20 }, (_, n) => a.handleWebhook(...figure(n + 1)));
    await Promise.all([tracking, ...figures]);
    // A figure lost to conflicts every time is counted (the next poll brings it again).
    const outcomes = (a as unknown as { ctx: { public: { outcomes: Map<string, number> } } }).ctx.public.outcomes;
    const lost = outcomes.get("conflicts") ?? 0;
    // The first read's figure and the 20 figures; a quantities probe (the balance of 0 after the
    // first read may be probed by the poll loop meanwhile) is an outcome of its own.
    const applied = [...outcomes].filter(([what]) => !what.startsWith("probe"));
    assert.equal(applied.reduce((sum, [, n]) => sum + n, 0), 21);
    const read = await a.balance(calls, { ...who, fresh: true });
    assert.equal(read.consumed, TRACKS);
    const state = stateKey(new Customer("external", customer), calls);
    assert.equal(await probe.hget(state, "n"), String(TRACKS));
    if (lost === 0) assert.equal(read.credited, 120);
    assert.equal(JSON.parse((await probe.hget(state, "pub")) as string).a[1], read.credited);
  });

  /** An instance whose figure for `customer` is read, then (once, or every time) a track of
   * another instance lands before its script runs. */
  function trackAfterRead(a: Outpost, b: Outpost, customer: string, every: boolean): { reads: number } {
    const mode = (a as unknown as { ctx: { public: { anchors: { read: (state: string) => Promise<unknown> }; planner: { probeBand: number } } } }).ctx.public;
    // No quantities probe of the balance the tracks drive to zero and below: its write would read
    // the state too (the poll loop plans one each second), one more read than the figure's.
    mode.planner.probeBand = -Infinity;
    const read = mode.anchors.read.bind(mode.anchors);
    const seen = { reads: 0 };
    const ours = stateKey(new Customer("external", customer), calls);
    mode.anchors.read = async (state: string) => {
      const found = await read(state);
      if (state !== ours) return found; // (the figure names Polar's id too: nobody follows that one)
      seen.reads += 1;
      if (every || seen.reads === 1) await b.track("api_call", { externalCustomerId: customer });
      return found;
    };
    return seen;
  }

  function signedFigure(secret: string, customer: string, credited: number, consumed: number): [Buffer, Record<string, string>] {
    const meter = { id: "row", meter_id: calls, consumed_units: consumed, credited_units: credited, balance: credited - consumed, modified_at: new Date(Date.now() - 3_600_000).toISOString() };
    const body = Buffer.from(JSON.stringify({ type: "customer.state_changed", data: { id: "polar-id", external_id: customer, active_meters: [meter] } }));
    const stamp = Math.floor(Date.now() / 1000);
    const id = `msg_${customer}_${credited}`;
    return [body, { "webhook-id": id, "webhook-timestamp": String(stamp), "webhook-signature": sign(secretKey(secret), id, stamp, body) }];
  }

  it("a track landing between the read of a state and its anchor: the anchor reads again and applies, the event counts", async () => {
    const secret = "whsec_" + Buffer.from("another secret of the public mode").toString("base64");
    const [a, b] = [connect({ mode: "public", webhookSecret: secret }), connect({ mode: "public" })];
    const customer = uniqueCustomer("cas");
    const who = { externalCustomerId: customer };
    await a.track("api_call", who);
    assert.equal((await a.balance(calls, who)).consumed, 1);
    const seen = trackAfterRead(a, b, customer, false);
    assert.equal(await a.handleWebhook(...signedFigure(secret, customer, 7, 0)), 204);
    // The script found the revision moved: read and decided again (once more when an
    // acknowledgement lands in between too).
    assert.ok(seen.reads >= 2, `read ${seen.reads} times`);
    const read = await a.balance(calls, { ...who, fresh: true });
    assert.deepEqual([read.credited, read.consumed], [7, 2]);
  });

  it("a figure lost to conflicts every time writes nothing and is counted", async () => {
    const secret = "whsec_" + Buffer.from("a third secret of the public mode").toString("base64");
    const [a, b] = [connect({ mode: "public", webhookSecret: secret }), connect({ mode: "public" })];
    const customer = uniqueCustomer("lost");
    const who = { externalCustomerId: customer };
    assert.equal((await a.balance(calls, who)).credited, 0);
    const seen = trackAfterRead(a, b, customer, true);
    assert.equal(await a.handleWebhook(...signedFigure(secret, customer, 9, 0)), 204);
    assert.equal(seen.reads, 5);
    assert.equal((a as unknown as { ctx: { public: { outcomes: Map<string, number> } } }).ctx.public.outcomes.get("conflicts"), 1);
    const read = await a.balance(calls, { ...who, fresh: true });
    assert.deepEqual([read.credited, read.consumed], [0, 5]);
  });

  it("in the snapshot protocol a webhook is verified and answered 204, nothing applied", async () => {
    const secret = "whsec_" + Buffer.from("a secret of the snapshot protocol").toString("base64");
    // database 2: no configuration cached there (the public mode's would be refused)
    const a = connect({ mode: "snapshots", webhookSecret: secret, redisUrl: redis.url.replace(/\/0$/, "/2") });
    const customer = uniqueCustomer("snap");
    await a.start();
    assert.equal(a.mode, "snapshots");
    const [body, headers] = signedFigure(secret, customer, 9, 0);
    await assert.rejects(a.handleWebhook(body, { ...headers, "webhook-signature": "v1,AAAA" }), InvalidWebhook);
    assert.equal(await a.handleWebhook(body, headers), 204);
    const two = new Redis(redis.url.replace(/\/0$/, "/2"));
    try {
      assert.equal(await two.exists(stateKey(new Customer("external", customer), calls)), 0); // nothing applied
    } finally {
      two.disconnect();
    }
  });

  it("Redis down and back: the poll loop goes on, a new customer's first read is anchored again", async () => {
    const durable = await RedisServer.start(true);
    const warnings: string[] = [];
    const logger = { debug: () => {}, warn: (m: string) => warnings.push(m) };
    const a = connect({ mode: "public", pollInterval: 0.5, redisUrl: durable.url, logger });
    try {
      await emulator.admin("credits", { meter_id: calls, units: 2, external_customer_id: "before-outage" });
      assert.equal((await a.balance(calls, { externalCustomerId: "before-outage" })).credited, 2);
      await durable.halt();
      // The loop meets the outage (its configuration's refresh takes a request from the budget).
      const mode = (a as unknown as { ctx: { public: { lastError: string | null } } }).ctx.public;
      await eventually(() => mode.lastError !== null && mode.lastError.includes("Redis"), "the poll loop meeting the outage", 20);
      const said = warnings.filter((w) => w.includes(mode.lastError as string));
      assert.ok(said.length > 0 && said.every((w) => w.includes(": Redis failed") && !w.includes("Polar")), said.join("\n"));
      await durable.start();
      const customer = uniqueCustomer("after-outage");
      await emulator.admin("credits", { meter_id: calls, units: 4, external_customer_id: customer });
      await eventually(
        async () => {
          try {
            return (await a.balance(calls, { externalCustomerId: customer })).credited === 4;
          } catch (exc) {
            if (exc instanceof NotReady || exc instanceof RedisUnavailable) return false;
            throw exc;
          }
        },
        "a first read anchored after the outage",
        30,
      );
    } finally {
      await a.close(2);
      await durable.stop();
    }
  });

  it("never writes the webhook secret to a log line, an error or a getter", async () => {
    const secret = "whsec_" + Buffer.from("the secret that stays secret").toString("base64");
    const lines: string[] = [];
    const record = (m: string) => lines.push(m);
    const a = connect({ mode: "public", webhookSecret: secret, logger: { debug: record, info: record, warn: record } });
    const customer = uniqueCustomer("secret");
    await a.balance(calls, { externalCustomerId: customer });
    const [body, headers] = signedFigure(secret, customer, 3, 0);
    const errors = [await a.handleWebhook(body, { ...headers, "webhook-signature": "v1,AAAA" }).catch((exc: unknown) => String(exc))];
    errors.push(await a.handleWebhook(body, { ...headers, "webhook-timestamp": "1" }).catch((exc: unknown) => String(exc)));
    assert.equal(await a.handleWebhook(body, headers), 204);
    assert.throws(() => new Outpost(testOptions(emulator, redis, { webhookSecret: "whsec_not base64!" })), (exc: Error) => !exc.message.includes("not base64!"));
    const everything = [...lines, ...errors.map(String), a.modeReason, JSON.stringify(a.rejections)].join("\n");
    assert.ok(lines.length > 0 && errors.every((e) => String(e).startsWith("InvalidWebhook")), everything);
    for (const part of [secret, secret.slice("whsec_".length)]) assert.ok(!everything.includes(part), everything);
  });

  it("two instances share the anchors through Redis: the second reads warm without asking Polar", async () => {
    const a = connect({ mode: "public" });
    const b = connect({ mode: "public" });
    const customer = uniqueCustomer("shared");
    const who = { externalCustomerId: customer };
    await emulator.admin("credits", { meter_id: calls, units: 3, external_customer_id: customer });
    assert.equal((await a.balance(calls, who)).credited, 3);
    await a.track("api_call", who);
    await eventually(async () => {
      const read = await b.balance(calls, who);
      return read.consumed === 1 && read.credited === 3 && read.source === "memory";
    }, "b reading a's anchor and event from memory", 20);
  });

  it("refuses to share a Redis whose cached configuration another mode built", async () => {
    const a = connect({ mode: "public" });
    await a.balance(calls, { externalCustomerId: uniqueCustomer("conflict") }); // caches the public configuration
    const b = connect({ mode: "snapshots" });
    await assert.rejects(b.balance(calls, { externalCustomerId: "c1" }), ConfigurationError);
  });

  it("a start refused for a conflicting mode is tried again by the next call once the conflict is gone", async () => {
    const url = redis.url.replace(/\/0$/, "/2"); // database 2: this test's own cached configuration
    const database = new Redis(url);
    try {
      await database.set(CONFIGURATION_KEY, "{}"); // as a snapshots-mode instance caches it
      const b = connect({ mode: "public", redisUrl: url });
      const customer = uniqueCustomer("retry");
      await assert.rejects(b.balance(calls, { externalCustomerId: customer }), ConfigurationError);
      await database.del(CONFIGURATION_KEY); // the other mode's instances are gone, their Redis wiped
      await emulator.admin("credits", { meter_id: calls, units: 2, external_customer_id: customer });
      assert.equal((await b.balance(calls, { externalCustomerId: customer })).credited, 2);
    } finally {
      database.disconnect();
    }
  });

  it("auto finding the public API on a Redis whose cached configuration the snapshot protocol built logs the conflict as an error (as Python)", async () => {
    const url = redis.url.replace(/\/0$/, "/3"); // database 3: this test's own cached configuration
    const database = new Redis(url);
    try {
      await database.set(CONFIGURATION_KEY, "{}"); // as a snapshots-mode instance caches it
      const lines = new Lines();
      const a = connect({ redisUrl: url, logger: lines.logger });
      await a.start();
      await eventually(async () => a.modeReason.includes("cannot share one Redis"), "the conflict found", 20);
      const said = (level: string) => lines.at(level).filter((l) => l.includes("cannot share one Redis"));
      assert.deepEqual([said("error").length, said("warn").length], [1, 0], lines.text);
    } finally {
      database.disconnect();
    }
  });

  it("without an answer from Polar, NotReady says what the public mode waits for", async () => {
    const down = `http://127.0.0.1:${await freePort()}`; // nothing listens there
    // database 1: no configuration cached there
    const a = connect({ mode: "public", serverUrl: down, redisUrl: redis.url.replace(/\/0$/, "/1"), snapshotTimeout: 0.5 });
    const error = await a.balance(calls, { externalCustomerId: uniqueCustomer("down") }).catch((exc: unknown) => exc);
    assert.ok(error instanceof NotReady, String(error));
    assert.match(error.message, /^no configuration from Polar's \/v1\/meters\/ yet \(last error: \/v1\/meters\/: ECONNREFUSED\)/);
    // Configured (cached by another instance), the read waits for the customer's figures.
    const b = connect({ mode: "public", serverUrl: down, snapshotTimeout: 0.5 });
    await connect({ mode: "public" }).balance(calls, { externalCustomerId: uniqueCustomer("up") }); // caches the configuration
    const waiting = await b.balance(calls, { externalCustomerId: "down-2" }).catch((exc: unknown) => exc);
    assert.ok(waiting instanceof NotReady, String(waiting));
    assert.match(waiting.message, /^Polar's customer meters of external:down-2 not read yet \(last error: .*ECONNREFUSED\)/);
  });
});

/** Whether the Python drivers this repository's .venv imports run the public mode. */
function pythonHasPublicMode(): boolean {
  const check = "import inspect, outpost_sync; print('mode' in inspect.signature(outpost_sync.Outpost).parameters)";
  // (from the test's own directory, as python_peer.py runs: the repository root is not on its path)
  return execFileSync(PYTHON, ["-c", check], { cwd: import.meta.dirname, encoding: "utf8" }).trim() === "True";
}

describe("a fleet of Python and TypeScript instances in the public-API mode", { skip: pythonHasPublicMode() ? false : "the Python drivers of this checkout have no public mode" }, () => {
  let redis: RedisServer;
  let emulator: Emulator;
  let calls: string;
  /** An avg, a min and a sum meter, by aggregation. */
  const meters = new Map<string, string>();
  let probe: Redis;

  before(async () => {
    [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start({ publicOnly: true, recomputeDelays: [0.2, 3600] })]);
    calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
    for (const func of ["avg", "min", "sum"]) meters.set(func, await emulator.createMeter(`latency-${func}`, CALLS_FILTER, { func, property: "ms" }));
    probe = redis.client();
  });
  after(async () => Promise.all([redis.stop(), emulator.stop()]));

  it("both find the public API, read each other's anchors and events, and converge on Polar's figure", async () => {
    let current: Outpost | null = null;
    const [server, url] = await endpoint(() => current);
    const { secret } = (await emulator.admin("webhooks", { url })) as { secret: string };
    const ts = new Outpost(testOptions(emulator, redis, { publicMargin: 0, pollInterval: 0.5, webhookSecret: secret }));
    current = ts;
    const python = await PythonPeer.start({ access_token: emulator.token, server_url: emulator.url, redis_url: redis.url, linger: 0.02, public_margin: 0, poll_interval: 0.5 });
    try {
      const customer = uniqueCustomer("fleet");
      const who = { externalCustomerId: customer };
      const pythonRead = () => python.call("balance", { meter_id: calls, external_customer_id: customer });
      await emulator.admin("credits", { meter_id: calls, units: 10, external_customer_id: customer });
      assert.equal((await pythonRead()).credited, 10); // the Python instance anchors the customer
      assert.equal((await ts.balance(calls, who)).credited, 10);
      assert.deepEqual([ts.mode, (await python.call("status")).mode], ["public", "public"]);
      await ts.track("api_call", who);
      await ts.track("api_call", who);
      await python.call("track", { name: "api_call", external_customer_id: customer });
      await eventually(async () => (await ts.balance(calls, who)).consumed === 3, "TypeScript counting the Python event", 20);
      await eventually(async () => (await pythonRead()).consumed === 3, "Python counting the TypeScript events", 20);
      assert.equal(await ts.flush(10), true);
      assert.equal(await python.call("flush", { timeout: 10 }), true);
      // Polar recomputes; polls (either instance's) and the webhook (the TypeScript one's) anchor
      // its figure, and the events it includes leave the ledger: nothing counted twice.
      const state = stateKey(new Customer("external", customer), calls);
      await eventually(async () => (await probe.hget(state, "n")) === "0", "the events Polar counted to leave the ledger", 30);
      const [mine, theirs] = [await ts.balance(calls, { ...who, fresh: true }), await pythonRead()];
      assert.deepEqual([mine.credited, mine.consumed], [10, 3]);
      assert.deepEqual([theirs.credited, theirs.consumed, theirs.pending], [10, 3, 0]);
      // A grant: the TypeScript instance's webhook applies it, the Python one reads it.
      await emulator.admin("credits", { meter_id: calls, units: 5, external_customer_id: customer });
      await eventually(async () => (await pythonRead()).credited === 15, "Python reading the grant", 20);
    } finally {
      server.close();
      await python.close();
      await ts.close(2);
    }
  });
});
