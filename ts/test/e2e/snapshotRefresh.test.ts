/** A customer whose delivered events no snapshot counted, when Polar pushes nothing more: the
 * instance asks again (tests/drivers/_async/test_snapshots.py has the same case). Its own
 * emulator: the test sets and freezes the clock. */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { Outpost } from "../../src/index.js";
import { BUCKET_US, floorBucket } from "../../src/core/time.js";
import type { Settings } from "../../src/core/session.js";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { eventually } from "../support/eventually.js";
import { RedisServer } from "../support/redisServer.js";
import { testOptions } from "../support/testOptions.js";

describe("asking Polar again", () => {
  let redis: RedisServer;
  let emulator: Emulator;

  before(async () => {
    [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start()]);
  });
  after(async () => Promise.all([redis.stop(), emulator.stop()]));

  it("counts late events a pushed snapshot left pending, when nothing else moves", async () => {
    // Events for a bucket that just ended, held back by Polar's paused syncs: when they land,
    // Polar pushes a snapshot whose cold_until is before that bucket (its close-sync has not
    // run yet), and then nothing of the customer's moves, so Polar pushes nothing more.
    const calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
    await emulator.admin("credits", { meter_id: calls, units: 100, external_customer_id: "c1" });
    let nowUs = (await emulator.admin("clock")).now_us as number;
    const clock = { now: () => new Date(nowUs / 1000) };
    const a = new Outpost(testOptions(emulator, redis, { clock }));
    try {
      const core = (a as unknown as { ctx: { core: { settings: Settings } } }).ctx.core;
      core.settings = { ...core.settings, refreshAfter: 1 }; // a second, not ten minutes
      const who = { externalCustomerId: "c1" };
      const first = await a.balance(calls, who);
      const end = floorBucket(nowUs) + BUCKET_US;
      nowUs = end + 500_000; // half a second into the next bucket
      await emulator.admin("clock", { set: new Date(nowUs / 1000).toISOString(), freeze: true });
      await emulator.admin("faults", { syncs: "pause" });
      for (let i = 0; i < 5; i++) await a.track("api_call", { ...who, timestamp: new Date((end - 10_000_000) / 1000) });
      assert.equal(await a.flush(10), true);
      await emulator.admin("faults", { syncs: "resume" }); // Polar counts them and pushes
      await eventually(async () => (await a.balance(calls, who)).snapshotId !== first.snapshotId, "the snapshot pushed when Polar counted the events");
      const left = await a.balance(calls, who);
      assert.equal(left.coldUntilUs, end - BUCKET_US);
      assert.deepEqual([left.consumed, left.pending, left.polar.count], [5, 5, 0]);
      await emulator.admin("clock", { advance: 6 * 60 }); // that bucket synced; nothing moves
      nowUs += 6 * 60 * 1_000_000;
      await eventually(async () => {
        const b = await a.balance(calls, who);
        return b.pending === 0 && b.polar.count === 5;
      }, "the snapshot the instance asked for");
      const b = await a.balance(calls, who);
      assert.deepEqual([b.consumed, b.balance], [5, 95]);
    } finally {
      await a.close(2);
    }
  });
});
