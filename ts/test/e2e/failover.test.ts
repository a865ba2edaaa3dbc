/** A crashed process's events: another instance takes them once the crashed one's heartbeat
 * expired (liveness.ts), long before they are idle for claimIdle, and delivers them. A
 * settlement Redis lost: after a Redis failure the instance re-reads its own pending entries,
 * and settles them without waiting claimIdle. */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { once } from "node:events";
import { after, before, describe, it } from "node:test";
import { Redis } from "ioredis";
import { GROUP, allOutboxes } from "../../src/core/index.js";
import { Outpost } from "../../src/index.js";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { REPO } from "../support/paths.js";
import { PythonPeer } from "../support/pythonPeer.js";
import { RedisServer } from "../support/redisServer.js";
import { testOptions } from "../support/testOptions.js";

/** The consumers of the outbox group, over every shard's stream. */
async function consumers(url: string): Promise<string[]> {
  const probe = new Redis(url);
  try {
    const names = new Set<string>();
    for (let shard = 0; shard < 16; shard++) {
      const listing = (await probe.xinfo("CONSUMERS", `outpost:v2:{${shard}}:outbox`, "outpost")) as string[][];
      for (const item of listing) names.add(item[1] as string);
    }
    return [...names];
  } finally {
    probe.disconnect();
  }
}

describe("fail-over", () => {
  let redis: RedisServer;
  let emulator: Emulator;
  let calls: string;

  before(async () => {
    [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start()]);
    calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  });
  after(async () => Promise.all([redis.stop(), emulator.stop()]));

  /** A TypeScript process that tracked `count` events for `customer`, read them into its delivery
   * loop and was SIGKILLed before posting them. */
  async function crashed(customer: string, count: number): Promise<void> {
    const options = { token: emulator.token, server: emulator.url, redis: redis.url, customer, count, heartbeat: 1 };
    const script = join(REPO, "ts", "test", "support", "trackAndHang.ts");
    const child = spawn(process.execPath, ["--import", "tsx", script, JSON.stringify(options)], {
      cwd: join(REPO, "ts"),
      stdio: ["ignore", "pipe", "inherit"],
    });
    const [held] = (await once(child.stdout!, "data")) as [Buffer];
    assert.equal(held.toString(), "held\n");
    child.kill("SIGKILL");
    await once(child, "exit");
    assert.equal((await emulator.customerMeter(calls, customer)).consumed_units, 0);
  }

  it("delivers the events a killed process had read and never posted", async () => {
    const customer = uniqueCustomer();
    await crashed(customer, 4);

    const survivor = new Outpost({
      ...testOptions(emulator, redis),
      heartbeat: 1, // surveys every quarter second; claimIdle stays 300 s
    });
    try {
      await survivor.start();
      await eventually(async () => (await emulator.customerMeter(calls, customer)).consumed_units === 4, "the claimed events to reach Polar", 20);
      assert.equal(await survivor.flush(10), true);
      const balance = await survivor.balance(calls, { externalCustomerId: customer });
      assert.equal(balance.consumed, 4);
      assert.equal(balance.undelivered, 0);
      // The dead consumer left the group once it held nothing.
      await eventually(async () => (await consumers(redis.url)).length === 1, "the dead consumer to be removed");
    } finally {
      await survivor.close(2);
    }
  });

  it("a Python instance takes over what a killed TypeScript process held, by its heartbeat", async () => {
    const customer = uniqueCustomer();
    await crashed(customer, 2);
    const peer = await PythonPeer.start({ access_token: emulator.token, server_url: emulator.url, redis_url: redis.url, linger: 0.02, heartbeat: 1 });
    try {
      // flush() starts its delivery loop, and returns once the dead process's entries are settled.
      assert.equal(await peer.call("flush", { timeout: 15 }), true);
      assert.equal((await emulator.customerMeter(calls, customer)).consumed_units, 2);
    } finally {
      await peer.close();
    }
  });
});

describe("after a Redis failure", () => {
  let redis: RedisServer;
  let emulator: Emulator;
  let calls: string;

  before(async () => {
    [redis, emulator] = await Promise.all([RedisServer.start(true), Emulator.start()]);
    calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  });
  after(async () => Promise.all([redis.stop(), emulator.stop()]));

  for (const maxInFlight of [1, 2]) {
    it(`a settlement Redis lost is redone at once: the instance re-reads its own pending entries (${maxInFlight} delivery loops)`, async () => {
      const customer = uniqueCustomer();
      const first = new Outpost(testOptions(emulator, redis)); // caches Polar's configuration in Redis
      await first.balance(calls, { externalCustomerId: customer });
      await first.close(5);
      const writer = new Outpost(testOptions(emulator, redis, { accessToken: "" })); // no token: its event stays queued
      const a = new Outpost(testOptions(emulator, redis, { maxInFlight })); // claimIdle: the default 300 s
      try {
        await writer.track("api_call", { externalCustomerId: customer });
        // Delivered to a's consumer and never settled, as a settlement the old primary acknowledged
        // and never replicated leaves it on the promoted replica (a does not know).
        const client = redis.client();
        for (const stream of allOutboxes()) await client.xgroup("CREATE", stream, GROUP, "0", "MKSTREAM").catch(() => {});
        const consumer = (a as unknown as { ctx: { consumer: string } }).ctx.consumer;
        const read = (await client.xreadgroup("GROUP", GROUP, consumer, "STREAMS", ...allOutboxes(), ...allOutboxes().map(() => ">"))) as [string, unknown[]][];
        assert.equal(read.reduce((n, [, entries]) => n + entries.length, 0), 1);
        assert.equal((await a.balance(calls, { externalCustomerId: customer })).consumed, 1); // a starts
        await redis.halt(); // a Redis failure every loop meets
        await redis.start();
        // Not a speed assertion: without the re-read, the entry waits for claimIdle (300 s).
        assert.equal(await a.flush(20), true);
        assert.equal((await emulator.customerMeter(calls, customer)).consumed_units, 1);
      } finally {
        await a.close(2);
        await writer.close(2);
      }
    });
  }

  it("two idle delivery loops re-read their pending entries after a failure neither met (the subscription's)", async () => {
    // A loop due to re-read while the other one reads does not block in a read of its own, or each
    // would keep the other from it in turn until a loop did something else (a beat, a claim check).
    const customer = uniqueCustomer();
    const first = new Outpost(testOptions(emulator, redis)); // caches Polar's configuration in Redis
    await first.balance(calls, { externalCustomerId: customer });
    await first.close(5);
    const writer = new Outpost(testOptions(emulator, redis, { accessToken: "" })); // no token: its event stays queued
    // heartbeat: beats 150 s apart, so none breaks the loops' rhythm.
    const a = new Outpost(testOptions(emulator, redis, { maxInFlight: 2, heartbeat: 600 }));
    try {
      await writer.track("api_call", { externalCustomerId: customer });
      // Delivered to a's consumer and never settled, as a settlement Redis lost leaves it.
      const client = redis.client();
      const consumer = (a as unknown as { ctx: { consumer: string } }).ctx.consumer;
      const read = (await client.xreadgroup("GROUP", GROUP, consumer, "STREAMS", ...allOutboxes(), ...allOutboxes().map(() => ">"))) as [string, unknown[]][];
      assert.equal(read.reduce((n, [, entries]) => n + entries.length, 0), 1);
      assert.equal((await a.balance(calls, { externalCustomerId: customer })).consumed, 1); // a starts
      await eventually(async () => (await client.info("clients")).includes("blocked_clients:2"), "both delivery loops in a blocking read");
      await client.call("CLIENT", "KILL", "TYPE", "pubsub");
      const pending = async () => {
        let count = 0;
        for (const stream of allOutboxes()) count += Number(((await client.xpending(stream, GROUP)) as unknown[])[0]);
        return count;
      };
      // Not a speed assertion: without the re-read, the entry waits for the claim check (30 s).
      await eventually(async () => (await pending()) === 0, "the pending entry re-read and settled", 10);
    } finally {
      await a.close(2);
      await writer.close(2);
    }
  });

  it("delivery and surveys go on after Redis loses its data (its groups gone: reads say NOGROUP, surveys no such key)", async () => {
    const customer = uniqueCustomer();
    const a = new Outpost(testOptions(emulator, redis, { heartbeat: 0.4 })); // surveys every 0.1 s
    try {
      await a.track("api_call", { externalCustomerId: customer });
      assert.equal(await a.flush(10), true);
      await redis.client().flushall();
      await a.track("api_call", { externalCustomerId: customer });
      assert.equal(await a.flush(10), true);
      assert.equal((await emulator.customerMeter(calls, customer)).consumed_units, 2);
    } finally {
      await a.close(2);
    }
  });
});
