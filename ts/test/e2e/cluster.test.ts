/** The driver on a real Redis Cluster of four primaries and four replicas (redis-cli --cluster
 * create), its deployment of 64 shards: each shard's scripts on the node owning its slot, each
 * shard channel subscribed on its owner, each shard's outbox read on its own; a primary SIGKILLed
 * and replaced by its replica; TypeScript and Python instances sharing the cluster and its count. */

import assert from "node:assert/strict";
import { Redis } from "ioredis";
import { after, afterEach, before, describe, it } from "node:test";
import { Customer, SHARDS_KEY, allChannels, shardOf } from "../../src/core/index.js";
import { slotOf } from "../../src/driver/cluster.js";
import { ConfigurationError, InsufficientBalance, Outpost, type OutpostOptions } from "../../src/index.js";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { untilTrackWorks } from "../support/failing.js";
import { PythonPeer } from "../support/pythonPeer.js";
import { RedisCluster } from "../support/redisCluster.js";
import { QUIET } from "../support/testOptions.js";

const SHARDS = 64; // more than 16: a shard per primary and more, four times over

/** The slot of a customer's keys and channel in this deployment. */
function slotOfCustomer(customer: string): number {
  return slotOf(allChannels("", SHARDS)[shardOf(new Customer("external", customer), SHARDS)] as string);
}

describe("on a Redis Cluster (4 primaries, 4 replicas, 64 shards)", () => {
  let cluster: RedisCluster;
  let emulator: Emulator;
  let calls: string;
  const open: Outpost[] = [];

  before(async () => {
    [cluster, emulator] = await Promise.all([RedisCluster.start(4, 1), Emulator.start()]);
    calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  });
  afterEach(async () => {
    await Promise.allSettled(open.splice(0).map((o) => o.close(2)));
  });
  after(async () => {
    await Promise.all([cluster.stop(), emulator.stop()]);
  });

  function connect(options: OutpostOptions = {}): Outpost {
    const outpost = new Outpost({ accessToken: emulator.token, serverUrl: emulator.url, redisUrl: cluster.url, telemetry: false, linger: 0.02, logger: QUIET, shards: SHARDS, ...options });
    open.push(outpost);
    return outpost;
  }

  /** A warm read that counts `consumed`, from memory (the instance follows the shard's channel). */
  async function warmRead(outpost: Outpost, customer: string, consumed: number, what: string): Promise<void> {
    await eventually(
      async () => {
        const found = await outpost.balance(calls, { externalCustomerId: customer });
        return found.consumed === consumed && found.source === "memory";
      },
      what,
      20,
    );
  }

  /** Two instances reading a new customer, b counting from memory the event a tracked. */
  async function bFollowingA(): Promise<[Outpost, Outpost, string]> {
    const a = connect();
    const b = connect();
    const customer = uniqueCustomer();
    await Promise.all([a.balance(calls, { externalCustomerId: customer }), b.balance(calls, { externalCustomerId: customer })]);
    await a.track("api_call", { externalCustomerId: customer });
    await warmRead(b, customer, 1, "b counting a's event");
    return [a, b, customer];
  }

  it("two instances read each other's events from memory, and deliver them", async () => {
    const [a, b] = [connect(), connect()];
    const customer = uniqueCustomer();
    await Promise.all([a.balance(calls, { externalCustomerId: customer }), b.balance(calls, { externalCustomerId: customer })]);
    await eventually(() => a.subscribed && b.subscribed, "both following every shard channel", 20);
    await a.track("api_call", { externalCustomerId: customer });
    await b.track("api_call", { externalCustomerId: customer });
    await warmRead(a, customer, 2, "a counting b's event from memory");
    await warmRead(b, customer, 2, "b counting a's event from memory");
    // Events of customers on every primary's shards, delivered by reads of each shard's stream.
    const others = Array.from({ length: 12 }, () => uniqueCustomer("spread"));
    for (const other of others) await a.track("api_call", { externalCustomerId: other });
    assert.equal(await a.flush(20), true);
    assert.equal((await emulator.customerMeter(calls, customer)).consumed_units, 2);
    for (const other of others) assert.equal((await emulator.customerMeter(calls, other)).consumed_units, 1);
  });

  it("reads the outboxes less often while idle: each empty round waits twice as long, up to the read's block", async () => {
    const a = connect();
    const customer = uniqueCustomer("idle");
    await a.track("api_call", { externalCustomerId: customer }); // starts the loops
    const signal = (a as unknown as { ctx: { deliveryWake: { wait: (version: number, timeout: number) => Promise<void> } } }).ctx.deliveryWake;
    const waits: number[] = [];
    const wait = signal.wait.bind(signal);
    signal.wait = (version, timeout) => {
      waits.push(Math.round(timeout * 1000) / 1000);
      return wait(version, timeout);
    };
    await eventually(() => waits.includes(0.5), "idle rounds reaching the block", 15);
    assert.deepEqual(waits.filter((w) => [0.05, 0.1, 0.2, 0.4].includes(w)).slice(0, 4), [0.05, 0.1, 0.2, 0.4]);
    const seen = waits.length;
    await a.track("api_call", { externalCustomerId: customer });
    assert.equal(await a.flush(10), true);
    await eventually(() => waits.slice(seen).includes(0.05), "an idle round of 50 ms again", 15);
    assert.equal((await emulator.customerMeter(calls, customer)).consumed_units, 2);
  });

  it("admits exactly: a hold taken by one instance limits what the other admits", async () => {
    const [a, b] = [connect(), connect()];
    const customer = uniqueCustomer("admit");
    const who = { externalCustomerId: customer };
    await emulator.admin("credits", { meter_id: calls, units: 3, external_customer_id: customer });
    await eventually(async () => (await a.balance(calls, who)).credited === 3, "a seeing the credits", 20);
    const held = await a.reserve(calls, 2, who);
    await eventually(async () => (await b.balance(calls, who)).held === 2, "b seeing a's hold", 20);
    await assert.rejects(b.reserve(calls, 2, who), InsufficientBalance);
    await b.track("api_call", { ...who, requireBalance: true });
    await assert.rejects(b.track("api_call", { ...who, requireBalance: true }), InsufficientBalance);
    await held.commit("api_call");
    const read = await a.balance(calls, { ...who, fresh: true });
    assert.deepEqual([read.consumed, read.held, read.available], [2, 0, 1]);
  });

  it("goes on through the SIGKILL of the primary owning a customer's shard: tracks, reads warm again, delivers", async () => {
    // claimIdle stays 300 s: a settlement the killed primary acknowledged but never replicated
    // leaves its entry pending on the promoted replica, and the instance re-reads its own pending
    // entries after the Redis failure, so the flush below does not wait for claimIdle.
    const [a, b, customer] = await bFollowingA();
    const slot = slotOfCustomer(customer);
    const owner = await cluster.portForSlot(slot);
    // A customer whose shard another primary owns: its copies keep following through the kill.
    let spared = uniqueCustomer("spared");
    while ((await cluster.portForSlot(slotOfCustomer(spared))) === owner) spared = uniqueCustomer("spared");
    await a.track("api_call", { externalCustomerId: spared });
    await warmRead(b, spared, 1, "b counting the spared customer's event");
    cluster.kill(owner);
    for (let i = 0; i < 20; i++) {
      const read = await b.balance(calls, { externalCustomerId: spared });
      assert.deepEqual([read.consumed, read.source], [1, "memory"]);
      await new Promise((resolve) => setImmediate(resolve));
    }
    await cluster.waitHealthy();
    assert.notEqual((await cluster.slotOwners()).find(([start, end]) => start <= slot && slot <= end)?.[2], owner);
    await untilTrackWorks(a, customer, "track() working on the replica that took over");
    // Whatever the kill lost (replication is asynchronous), both read the same, warm, and follow.
    await eventually(
      async () => {
        const [x, y] = await Promise.all([a.balance(calls, { externalCustomerId: customer }), b.balance(calls, { externalCustomerId: customer })]);
        return x.consumed === y.consumed && x.consumed >= 1 && x.source === "memory" && y.source === "memory";
      },
      "both warm and equal after the fail-over",
      20,
    );
    const before = (await b.balance(calls, { externalCustomerId: customer })).consumed;
    await a.track("api_call", { externalCustomerId: customer });
    await warmRead(b, customer, before + 1, "b following the shard's channel on its new owner");
    assert.equal(await a.flush(20), true);
    assert.equal((await emulator.customerMeter(calls, customer)).consumed_units, before + 1);
  });

  it("tracks through each step of a slot migration (ASK, then MOVED), and reads follow the shard's channel to its new owner", async () => {
    const [a, b, customer] = await bFollowingA();
    // The shard's keys and its channel share one hash tag, so one slot.
    const slot = slotOfCustomer(customer);
    const source = await cluster.portForSlot(slot);
    const target = (await cluster.primaryPorts()).find((port) => port !== source) as number;
    await cluster.beginMigration(slot, target);
    await a.track("api_call", { externalCustomerId: customer }); // the keys still on the source
    await cluster.moveKeys(slot, target);
    await a.track("api_call", { externalCustomerId: customer }); // the source answers ASK
    await cluster.endMigration(slot, target);
    assert.equal(await cluster.portForSlot(slot), target);
    await a.track("api_call", { externalCustomerId: customer }); // MOVED, then the target
    await warmRead(b, customer, 4, "b following the shard's channel on the slot's new owner");
    await warmRead(a, customer, 4, "a reading its own events");
    assert.equal(await a.flush(20), true);
    assert.equal((await emulator.customerMeter(calls, customer)).consumed_units, 4);
  });

  it("a Python instance and a TypeScript one share the cluster: each reads what the other tracked", async () => {
    const ts = connect();
    const customer = uniqueCustomer();
    const peer = await PythonPeer.start({ access_token: emulator.token, server_url: emulator.url, redis_url: cluster.url, linger: 0.02, shards: SHARDS });
    try {
      await ts.balance(calls, { externalCustomerId: customer });
      await peer.call("balance", { meter_id: calls, external_customer_id: customer });
      await peer.call("track", { name: "api_call", external_customer_id: customer });
      await warmRead(ts, customer, 1, "TypeScript counting Python's event from memory");
      await ts.track("api_call", { externalCustomerId: customer });
      await eventually(async () => (await peer.call("balance", { meter_id: calls, external_customer_id: customer })).consumed === 2, "Python counting TypeScript's event", 20);
      assert.equal(await ts.flush(20), true);
      assert.equal((await emulator.customerMeter(calls, customer)).consumed_units, 2);
    } finally {
      await peer.close();
    }
  });

  it("an instance of either SDK configured for another count refuses to start, naming both counts", async () => {
    const first = connect();
    await first.start(); // the deployment's count is stored by then
    const node = new Redis({ port: await cluster.portForSlot(slotOf(SHARDS_KEY)), lazyConnect: true });
    try {
      assert.equal(await node.get(SHARDS_KEY), String(SHARDS));
    } finally {
      node.disconnect();
    }
    const narrow = connect({ shards: 16 });
    await assert.rejects(narrow.track("api_call", { externalCustomerId: uniqueCustomer() }), (exc: unknown) => {
      assert.ok(exc instanceof ConfigurationError);
      assert.match(exc.message, /configured for 16 shards but the deployment's Redis holds 64 shards/);
      return true;
    });
    const peer = await PythonPeer.start({ access_token: emulator.token, server_url: emulator.url, redis_url: cluster.url });
    try {
      await assert.rejects(peer.call("track", { name: "api_call", external_customer_id: uniqueCustomer() }), /configured for 16 shards but the deployment's Redis holds 64 shards/);
    } finally {
      await peer.close();
    }
  });
});
