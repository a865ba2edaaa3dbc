/** A crashed process's events: another instance takes them once the crashed one's heartbeat
 * expired (liveness.ts), long before they are idle for claimIdle, and delivers them. */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { once } from "node:events";
import { after, before, describe, it } from "node:test";
import { Redis } from "ioredis";
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
