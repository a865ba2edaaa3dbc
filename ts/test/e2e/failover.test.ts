/** A crashed process's events: another instance claims them once idle and delivers them. */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { once } from "node:events";
import { after, before, describe, it } from "node:test";
import { Outpost } from "../../src/index.js";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { REPO } from "../support/paths.js";
import { RedisServer } from "../support/redisServer.js";

describe("fail-over", () => {
  let redis: RedisServer;
  let emulator: Emulator;
  let calls: string;

  before(async () => {
    [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start()]);
    calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  });
  after(async () => Promise.all([redis.stop(), emulator.stop()]));

  it("delivers the events a killed process had read and never posted", async () => {
    const customer = uniqueCustomer();
    const options = { token: emulator.token, server: emulator.url, redis: redis.url, customer, count: 4 };
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

    const survivor = new Outpost({
      accessToken: emulator.token,
      serverUrl: emulator.url,
      redisUrl: redis.url,
      telemetry: false,
      linger: 0.02,
      claimIdle: 0.5,
      logger: { debug: () => {}, warn: () => {} },
    });
    try {
      await survivor.start();
      await eventually(async () => (await emulator.customerMeter(calls, customer)).consumed_units === 4, "the claimed events to reach Polar", 20);
      assert.equal(await survivor.flush(10), true);
      const balance = await survivor.balance(calls, { externalCustomerId: customer });
      assert.equal(balance.consumed, 4);
      assert.equal(balance.undelivered, 0);
    } finally {
      await survivor.close(2);
    }
  });
});
