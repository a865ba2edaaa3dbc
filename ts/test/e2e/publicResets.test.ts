/** The public-API mode's resets against the emulator serving Polar's public API only and a real
 * redis-server (tests/drivers/_async/test_public_resets.py has the same case): a cycle whose own
 * figure was lost is still a new window when the next figure's webhook says when the period
 * began, though consumed did not fall. */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { Outpost } from "../../src/index.js";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { RedisServer } from "../support/redisServer.js";
import { testOptions } from "../support/testOptions.js";
import { endpoint } from "../support/webhookEndpoint.js";

describe("the public-API mode's resets", () => {
  let redis: RedisServer;
  let emulator: Emulator;
  let calls: string;

  before(async () => {
    [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start({ publicOnly: true, recomputeDelays: [0.2, 3600] })]);
    calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  });
  after(async () => Promise.all([redis.stop(), emulator.stop()]));

  it("starts a new window at the period start a webhook reports, though consumed did not fall", async () => {
    let current: Outpost | null = null;
    const [server, url] = await endpoint(() => current);
    try {
      const { secret } = (await emulator.admin("webhooks", { url })) as { secret: string };
      // Polls a minute apart: the figures come by webhook. Margin 0: the emulator's clock is this
      // machine's, and it stamps a recompute after reading.
      current = new Outpost(testOptions(emulator, redis, { mode: "public", publicMargin: 0, pollInterval: 60, webhookSecret: secret }));
      const customer = uniqueCustomer("cycle");
      const who = { externalCustomerId: customer };
      const reads = async (balance: number) => {
        const read = await (current as Outpost).balance(calls, who);
        return read.balance === balance && read.pending === 0;
      };
      await emulator.admin("credits", { meter_id: calls, units: 100, external_customer_id: customer });
      assert.equal(await reads(100), true);
      for (let i = 0; i < 3; i++) await current.track("api_call", who);
      assert.equal(await current.flush(10), true);
      await eventually(() => reads(97), "the old window's figure", 20);
      await emulator.admin("faults", { webhook_drop: { count: 1 } });
      await emulator.admin("cycle", { meter_id: calls, units: 50, external_customer_id: customer }); // its figure is lost
      const dropped = async () => ((await emulator.admin("webhooks")) as { deliveries: { outcome: string }[] }).deliveries.some((d) => d.outcome === "dropped");
      await eventually(dropped, "the cycle's webhook lost");
      for (let i = 0; i < 5; i++) await current.track("api_call", who); // more than the old window had
      assert.equal(await current.flush(10), true);
      await eventually(() => reads(45), "the new window's balance", 20);
      assert.equal((await emulator.customerMeter(calls, customer)).balance, 45);
      const outcomes = (current as unknown as { ctx: { public: { outcomes: Map<string, number> } } }).ctx.public.outcomes;
      assert.equal(outcomes.get("reset"), 1);
    } finally {
      server.close();
      await current?.close(2);
    }
  });
});
