/** The public-API mode's quantities probes against the emulator serving Polar's public API only
 * and a real redis-server (tests/drivers/_async/test_public_probes.py has the same cases): a
 * customer meter at the band is probed, and what the probe proves leaves the ledger while Polar's
 * own customer meter is not recomputed yet. */

import assert from "node:assert/strict";
import { after, afterEach, before, describe, it } from "node:test";
import { Outpost, type OutpostOptions } from "../../src/index.js";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { RedisServer } from "../support/redisServer.js";
import { testOptions } from "../support/testOptions.js";

interface Probing {
  outcomes: Map<string, number>;
}

describe("the public-API mode's probes", () => {
  let redis: RedisServer;
  let emulator: Emulator;
  let calls: string;
  /** How far this test moved the emulator's clock: Outpost's clock moves along. */
  let shiftMs = 0;
  const open: Outpost[] = [];

  before(async () => {
    // Polar recomputes an hour after a customer's last ingest: only a probe tells what it counts.
    [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start({ publicOnly: true, recomputeDelays: [3600, 7200] })]);
    calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  });
  afterEach(async () => {
    await Promise.allSettled(open.splice(0).map((o) => o.close(2)));
  });
  after(async () => Promise.all([redis.stop(), emulator.stop()]));

  function connect(options: OutpostOptions = {}): Outpost {
    const clock = { now: () => new Date(Date.now() + shiftMs) };
    const outpost = new Outpost(testOptions(emulator, redis, { publicMargin: 0, clock, ...options }));
    open.push(outpost);
    return outpost;
  }

  async function advance(seconds: number): Promise<void> {
    await emulator.admin("clock", { advance: seconds });
    shiftMs += seconds * 1000;
  }

  it("probes a balance at the band; the events the probe counts leave the ledger", async () => {
    const a = connect({ mode: "public", pollInterval: 60 });
    const customer = uniqueCustomer("probe");
    const who = { externalCustomerId: customer };
    await emulator.admin("credits", { meter_id: calls, units: 3, external_customer_id: customer });
    assert.equal((await a.balance(calls, who)).balance, 3);
    await a.track("api_call", who);
    await a.track("api_call", who);
    assert.equal(await a.flush(10), true);
    await advance(30); // both acknowledged well before the replica's lag
    await a.track("api_call", who); // the balance reaches 0
    const outcomes = (a as unknown as { ctx: { public: Probing } }).ctx.public.outcomes;
    await eventually(async () => (outcomes.get("probed") ?? 0) >= 1 && (await a.balance(calls, who)).pending === 1, "the probe dropping the two events it counts");
    const read = await a.balance(calls, who);
    const truth = await emulator.customerMeter(calls, customer);
    assert.equal(read.credited, 3);
    assert.ok(read.balance <= truth.balance && truth.balance === 0, `${read.balance} against ${truth.balance}`);
    const rows = (await emulator.admin("state")) as { counters: Record<string, number> };
    assert.ok((rows.counters.http_quantities ?? 0) >= 1);
  });
});
