/** The driver end to end: a real redis-server and the Python emulator of Polar, both started here. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Redis } from "ioredis";
import { DEFAULT_SERVER_URL, NotReady, Outpost, OutpostClosed, RedisUnavailable } from "../../src/index.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { Lines } from "../support/lines.js";
import { untilTrackWorks } from "../support/failing.js";
import { SCRIPT_SHA1 } from "../../src/core/scripts.generated.js";
import { world } from "../support/world.js";

describe("the driver against the emulator", () => {
  const w = world();

  const { connect } = w;

  /** Two instances that have both read a new customer (each follows it). */
  async function twoReading(): Promise<[Outpost, Outpost, string]> {
    const a = connect();
    const b = connect();
    const customer = uniqueCustomer();
    await a.balance(w.calls, { externalCustomerId: customer });
    await b.balance(w.calls, { externalCustomerId: customer });
    return [a, b, customer];
  }

  /** The delivery 0 loop logged once that it failed with `error` (its stack too) and restarted,
   * and Polar counted `customer`'s three events once. */
  async function restartedOnce(lines: Lines, error: string, customer: string): Promise<void> {
    const failed = lines.at("error").filter((l) => l.startsWith(`outpost: the delivery 0 loop failed (1 in a row; restarted): ${error}`));
    assert.equal(failed.length, 1, lines.text);
    assert.match(failed[0] as string, /\n\s+at /); // its stack
    assert.equal((await w.emulator.customerMeter(w.calls, customer)).consumed_units, 3);
  }

  it("answers a first read once Polar's snapshot is applied, and counts what it tracked", async () => {
    const outpost = connect();
    const customer = uniqueCustomer();
    const first = await outpost.balance(w.calls, { externalCustomerId: customer });
    assert.equal(first.consumed, 0);
    assert.ok(first.coldUntil instanceof Date);
    // mode "auto" (the default): Polar serves /v1/outpost/, so the snapshot protocol runs
    assert.deepEqual([outpost.mode, outpost.modeReason], ["snapshots", "Polar serves /v1/outpost/ (HTTP 101)"]);
    await outpost.track("api_call", { externalCustomerId: customer });
    await outpost.track("other", { externalCustomerId: customer });
    const after = await outpost.balance(w.calls, { externalCustomerId: customer });
    assert.equal(after.consumed, 1);
    assert.equal(after.pending, 1);
    assert.equal(after.balance, -1);
  });

  it("a closed instance refuses every call with OutpostClosed, a reservation of a customer in memory too (as the Python drivers)", async () => {
    const outpost = connect();
    const customer = uniqueCustomer();
    await outpost.balance(w.calls, { externalCustomerId: customer });
    await outpost.close();
    await outpost.close();
    await assert.rejects(outpost.balance(w.calls, { externalCustomerId: customer }), OutpostClosed);
    await assert.rejects(outpost.track("api_call", { externalCustomerId: customer }), OutpostClosed);
    await assert.rejects(outpost.reserve(w.calls, 1, { externalCustomerId: customer }), OutpostClosed);
    await assert.rejects(outpost.track("api_call", { externalCustomerId: customer, requireBalance: true }), OutpostClosed);
    await assert.rejects(outpost.flush(), OutpostClosed);
  });

  it("takes an empty option or environment variable as unset, as the Python SDK does", async () => {
    const names = ["REDIS_URL", "POLAR_ACCESS_TOKEN", "POLAR_SERVER_URL"] as const;
    const saved = names.map((name) => process.env[name]);
    try {
      process.env.REDIS_URL = w.redis.url;
      process.env.POLAR_ACCESS_TOKEN = "";
      process.env.POLAR_SERVER_URL = "";
      const outpost = w.closing(new Outpost({ redisUrl: "", accessToken: "", serverUrl: "", telemetry: false }));
      await outpost.start(); // on the environment's Redis
      const ctx = (outpost as unknown as { ctx: { serverUrl: string; accessToken: string | null } }).ctx;
      assert.deepEqual([ctx.serverUrl, ctx.accessToken], [DEFAULT_SERVER_URL, null]);
    } finally {
      names.forEach((name, i) => {
        const value = saved[i];
        if (value === undefined) delete process.env[name];
        else process.env[name] = value;
      });
    }
  });

  it("logs what the session reports on the instance's logger: a first read's load, before the read answers", async () => {
    const lines = new Lines();
    const outpost = connect({ logger: lines.logger });
    const customer = uniqueCustomer();
    await outpost.balance(w.calls, { externalCustomerId: customer });
    const debug = lines.at("debug");
    const loads = debug.filter((l) => l.startsWith("outpost loads ") && l.includes(`:external:${customer}:`));
    assert.ok(loads.some((l) => l.endsWith("(copy at revision -1)")), lines.text);
    assert.ok(debug.some((l) => l.startsWith("outpost loaded ") && l.includes(`:external:${customer}:`)), lines.text);
  });

  it("a delivery loop that fails (a bug of ours) is logged with its stack and restarted with a fresh machine: the events are still delivered, once", async () => {
    const lines = new Lines();
    const outpost = connect({ logger: lines.logger, maxInFlight: 1 });
    const customer = uniqueCustomer();
    await outpost.balance(w.calls, { externalCustomerId: customer });
    const machines = (outpost as unknown as { ctx: { deliveries: { handle: (...args: unknown[]) => void }[] } }).ctx.deliveries;
    const first = machines[0];
    assert.ok(first !== undefined);
    first.handle = () => {
      throw new Error("a bug of ours in the delivery machine");
    };
    for (let i = 0; i < 3; i++) await outpost.track("api_call", { externalCustomerId: customer, metadata: { i } });
    assert.equal(await outpost.flush(10), true, lines.text);
    assert.notEqual(machines[0], first);
    await restartedOnce(lines, "Error: a bug of ours", customer);
  });

  it("a bug in a delivery loop's Redis call (a TypeError in the client's method) is logged as a bug with its stack, not as a Redis outage: the loop restarts and the events are delivered once", async () => {
    const lines = new Lines();
    const outpost = connect({ logger: lines.logger, maxInFlight: 1 });
    const customer = uniqueCustomer();
    await outpost.balance(w.calls, { externalCustomerId: customer });
    // The delivery loop's own connection: its settle script, after Polar took the batch, meets
    // a bug of ours once (the events are posted, and still pending in Redis).
    const [connection] = (outpost as unknown as { ctx: { connections: Redis[] } }).ctx.connections;
    assert.ok(connection !== undefined);
    const evalsha = connection.evalsha.bind(connection) as (...args: unknown[]) => Promise<unknown>;
    let thrown = 0;
    (connection as unknown as { evalsha: (...args: unknown[]) => Promise<unknown> }).evalsha = (...args) => {
      if (args[0] === SCRIPT_SHA1.acknowledge && thrown++ === 0) {
        return Promise.resolve().then(() => (undefined as unknown as { reply: unknown }).reply); // a real TypeError
      }
      return evalsha(...args);
    };
    for (let i = 0; i < 3; i++) await outpost.track("api_call", { externalCustomerId: customer, metadata: { i } });
    assert.equal(await outpost.flush(10), true, lines.text);
    assert.equal(thrown > 1, true, lines.text); // it threw, and the script ran again after the restart
    const warnings = lines.at("warn");
    assert.deepEqual(warnings.filter((l) => l.includes("Redis unreachable")), [], lines.text);
    await restartedOnce(lines, "TypeError: Cannot read properties of undefined", customer);
  });

  it("a delivery loop failing while its other settle scripts run restarts only once they ended: its re-read never takes entries one of them is settling", async () => {
    const lines = new Lines();
    // A long linger: the events of every shard go in one batch, settled by one script per shard.
    const outpost = connect({ logger: lines.logger, maxInFlight: 1, linger: 5 });
    const customers = Array.from({ length: 8 }, () => uniqueCustomer()); // in several shards
    for (const customer of customers) await outpost.balance(w.calls, { externalCustomerId: customer });
    const [connection] = (outpost as unknown as { ctx: { connections: Redis[] } }).ctx.connections;
    assert.ok(connection !== undefined);
    const methods = connection as unknown as Record<"evalsha" | "xreadgroup", (...args: unknown[]) => Promise<unknown>>;
    const [evalsha, xreadgroup] = [methods.evalsha.bind(connection), methods.xreadgroup.bind(connection)];
    // The first settle script meets a bug; the others are held until the loop re-reads its
    // pending entries (or a second passed: the loop waits for them before it restarts).
    let [thrown, settling, rereadWhileSettling] = [0, 0, false];
    let release: () => void = () => {};
    const released = new Promise<void>((resolve) => (release = resolve));
    setTimeout(release, 1000).unref();
    methods.evalsha = async (...args) => {
      if (args[0] !== SCRIPT_SHA1.acknowledge) return evalsha(...args);
      if (thrown++ === 0) return (undefined as unknown as { reply: unknown }).reply; // a real TypeError
      settling += 1;
      try {
        await released;
        return await evalsha(...args);
      } finally {
        settling -= 1;
      }
    };
    methods.xreadgroup = (...args) => {
      if (args.at(-1) === "0") {
        rereadWhileSettling ||= settling > 0;
        release();
      }
      return xreadgroup(...args);
    };
    for (const customer of customers) await outpost.track("api_call", { externalCustomerId: customer });
    assert.equal(await outpost.flush(15), true, lines.text);
    assert.ok(thrown > 2, lines.text); // one threw, at least one other was held
    assert.equal(rereadWhileSettling, false);
    assert.equal(lines.at("error").filter((l) => l.startsWith("outpost: the delivery 0 loop failed (1 in a row; restarted): TypeError")).length, 1, lines.text);
    for (const customer of customers) assert.equal((await w.emulator.customerMeter(w.calls, customer)).consumed_units, 1);
  });

  it("delivers on flush(): Polar counts the events, and a later snapshot settles them", async () => {
    const outpost = connect();
    const customer = uniqueCustomer();
    await outpost.balance(w.calls, { externalCustomerId: customer });
    for (let i = 0; i < 3; i++) await outpost.track("api_call", { externalCustomerId: customer, metadata: { i } });
    assert.equal(await outpost.flush(10), true);
    const meter = await w.emulator.customerMeter(w.calls, customer);
    assert.equal(meter.consumed_units, 3);
    const balance = await outpost.balance(w.calls, { externalCustomerId: customer });
    assert.equal(balance.consumed, 3);
    assert.equal(balance.undelivered, 0);
  });

  it("raises NotReady when Polar's snapshot comes too late, and answers once it came", async () => {
    const outpost = connect({ snapshotTimeout: 0.3 });
    const customer = uniqueCustomer();
    await outpost.start();
    await eventually(() => outpost.connected, "the WebSocket to open");
    await w.emulator.admin("faults", { snapshot_delay: 1.0 });
    try {
      await assert.rejects(outpost.balance(w.calls, { externalCustomerId: customer }), NotReady);
      await eventually(async () => {
        try {
          await outpost.balance(w.calls, { externalCustomerId: customer });
          return true;
        } catch (exc) {
          if (exc instanceof NotReady) return false;
          throw exc;
        }
      }, "the delayed snapshot to be applied");
    } finally {
      await w.emulator.admin("faults", { clear: true });
    }
  });

  it("applies the snapshots Polar pushes (a credit grant)", async () => {
    const outpost = connect();
    const customer = uniqueCustomer();
    assert.equal((await outpost.balance(w.calls, { externalCustomerId: customer })).credited, 0);
    await w.emulator.admin("credits", { meter_id: w.calls, external_customer_id: customer, units: 100 });
    await eventually(async () => (await outpost.balance(w.calls, { externalCustomerId: customer })).credited === 100, "the pushed credit");
  });

  it("reconnects after Polar drops the WebSocket, and asks for its customers again", async () => {
    const outpost = connect();
    const customer = uniqueCustomer();
    await outpost.balance(w.calls, { externalCustomerId: customer });
    await w.emulator.admin("faults", { drop_websockets: "close" });
    await eventually(() => !outpost.connected, "the drop to be noticed");
    await eventually(() => outpost.connected, "the WebSocket to reopen");
    await w.emulator.admin("credits", { meter_id: w.calls, external_customer_id: customer, units: 7 });
    await eventually(async () => (await outpost.balance(w.calls, { externalCustomerId: customer })).credited === 7, "a credit after the reconnection");
  });

  it("drops alone the one event Polar refuses (422) and delivers the rest", async () => {
    const dropped: [unknown[], string][] = [];
    const outpost = connect({ onDropped: (events, reason) => void dropped.push([events, reason]) });
    const customer = uniqueCustomer();
    await outpost.balance(w.calls, { externalCustomerId: customer });
    await outpost.track("api_call", { externalCustomerId: customer });
    const bad = await outpost.track("api_call", { customerId: "5da96107-6e1c-4db9-9f06-ff2ab930d318" });
    await outpost.track("api_call", { externalCustomerId: customer });
    assert.equal(await outpost.flush(10), true);
    assert.equal(dropped.length, 1);
    const [events, reason] = dropped[0] as [Record<string, unknown>[], string];
    assert.deepEqual(events.map((e) => e.external_id), [bad]);
    assert.match(reason, /422/);
    assert.equal((await w.emulator.customerMeter(w.calls, customer)).consumed_units, 2);
  });

  it("logs a dropped event as an error: without onDropped, and when onDropped throws", async () => {
    for (const onDropped of [undefined, () => { throw new Error("the merchant's callback failed"); }]) {
      const lines = new Lines();
      const outpost = connect({ logger: lines.logger, onDropped });
      await outpost.balance(w.calls, { externalCustomerId: uniqueCustomer() });
      await outpost.track("api_call", { customerId: "5da96107-6e1c-4db9-9f06-ff2ab930d318" }); // Polar refuses it: 422
      assert.equal(await outpost.flush(10), true);
      const said = onDropped === undefined ? /^outpost dropped 1 events: .*422/ : /onDropped threw .*the merchant's callback failed/;
      assert.ok(lines.at("error").some((l) => said.test(l)), lines.text);
      assert.ok(!lines.at("warn").some((l) => said.test(l)), lines.text);
      await outpost.close(); // the next round's event is this round's instance's to deliver no more
    }
  });

  it("survives a Redis restart: tracking fails while it is down, then copies and subscriptions come back", async () => {
    const [a, b, customer] = await twoReading();
    w.redis.kill();
    await assert.rejects(a.track("api_call", { externalCustomerId: customer }), RedisUnavailable);
    await eventually(() => !a.subscribed, "the subscription to drop");
    await w.redis.start(); // the same port, empty: the copies reload and ask Polar again
    await eventually(() => a.subscribed && b.subscribed, "both instances to subscribe again", 20);
    await untilTrackWorks(b, customer, "Redis to take writes again");
    await eventually(async () => {
      try {
        return (await a.balance(w.calls, { externalCustomerId: customer })).consumed >= 1;
      } catch (exc) {
        if (exc instanceof NotReady) return false;
        throw exc;
      }
    }, "the first instance to read the second one's event", 20);
  });

  it("close() does not wait for an ingestion request Polar hangs: it is aborted, the events stay queued", async () => {
    const outpost = connect();
    const customer = uniqueCustomer();
    await outpost.balance(w.calls, { externalCustomerId: customer });
    const ingests = async (): Promise<number> => (await w.emulator.admin("state")).counters.http_ingest ?? 0;
    const before = await ingests();
    await w.emulator.admin("faults", { ingest_hang: { seconds: 60, count: 1 } });
    try {
      await outpost.track("api_call", { externalCustomerId: customer });
      await eventually(async () => (await ingests()) > before, "the ingest to reach Polar");
      let timer: NodeJS.Timeout | undefined;
      const deadline = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error("close() waited for the hung request")), 20_000);
      });
      await Promise.race([outpost.close(0.2), deadline]);
      clearTimeout(timer);
    } finally {
      await w.emulator.admin("faults", { clear: true });
    }
  });

  it("reads Redis when asked fresh, and misses nothing while its subscription breaks", async () => {
    const [a, b, customer] = await twoReading();
    await b.track("api_call", { externalCustomerId: customer });
    const fresh = await a.balance(w.calls, { externalCustomerId: customer, fresh: true });
    assert.equal(fresh.source, "redis");
    assert.equal(fresh.consumed, 1); // never behind what any instance tracked before the call
    await eventually(async () => (await a.balance(w.calls, { externalCustomerId: customer })).source === "memory", "a warm read");
    const probe = new Redis(w.redis.url);
    try {
      await probe.call("CLIENT", "KILL", "TYPE", "pubsub"); // both subscribers break; what is published meanwhile is lost
    } finally {
      probe.disconnect();
    }
    await b.track("api_call", { externalCustomerId: customer });
    await eventually(async () => a.subscribed && (await a.balance(w.calls, { externalCustomerId: customer })).consumed === 2, "a to count the event tracked while it was not subscribed");
  });

  it("does not wake a waiting delivery loop at each change another instance makes", async () => {
    // A lingering loop wakes for a flush, a close, a settlement or its own deadline; not at every
    // change its instance applies.
    const a = connect({ linger: 5 });
    const b = connect({ linger: 5 });
    const customer = uniqueCustomer("lingering");
    await a.track("api_call", { externalCustomerId: customer }); // a's loops start; it lingers
    await a.balance(w.calls, { externalCustomerId: customer }); // a follows the customer
    const machine = (a as unknown as { ctx: { deliveries: { effects: () => unknown[] }[] } }).ctx.deliveries[0]!;
    const effects = machine.effects.bind(machine);
    let asked = 0;
    machine.effects = () => {
      asked += 1;
      return effects();
    };
    const tracks = 200;
    for (let n = 0; n < tracks; n += 1) await b.track("api_call", { externalCustomerId: customer });
    await eventually(async () => (await a.balance(w.calls, { externalCustomerId: customer })).consumed === tracks + 1, "a following b's tracks");
    assert.ok(asked < tracks / 4, `a's delivery loop went round ${asked} times for ${tracks} tracks`);
    assert.equal(await a.flush(10), true);
    assert.equal(await b.flush(10), true);
    assert.equal((await w.emulator.customerMeter(w.calls, customer)).consumed_units, tracks + 1);
  });
});
