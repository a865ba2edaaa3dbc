/** What a peer writes in Redis that is garbage never stops the copies, as the Python SDK
 * (tests/drivers/_async/test_hostile_peers.py): both instances, a real Redis and the emulator. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { channel } from "../../src/core/keys.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { world } from "../support/world.js";

describe("garbage a peer wrote in Redis", () => {
  const w = world();

  for (const rev of ["-5", "99999999999999999999", "1.5", "0x10"]) {
    it(`a state hash's revision ${rev} does not freeze the copies: their events count`, async () => {
      // The scripts went on counting from the garbage (-4, 1e+20, 2.5): revisions no reader
      // takes, so every copy kept the hash as it was and its events never counted.
      const customer = uniqueCustomer();
      const a = w.connect();
      const b = w.connect();
      assert.equal((await a.balance(w.calls, { externalCustomerId: customer })).consumed, 0);
      const client = w.redis.client();
      try {
        const [state] = (await client.keys(`outpost:v2:*:external:${customer}:*`)).filter(
          (key) => !key.includes(":ev:") && !key.endsWith(":acked"),
        );
        assert.ok(state !== undefined);
        await client.hset(state, "rev", rev);
      } finally {
        client.disconnect();
      }
      assert.equal((await b.balance(w.calls, { externalCustomerId: customer })).consumed, 0);
      await a.track("api_call", { externalCustomerId: customer });
      await a.track("api_call", { externalCustomerId: customer });
      assert.equal((await a.balance(w.calls, { externalCustomerId: customer })).consumed, 2);
      await eventually(
        async () => (await b.balance(w.calls, { externalCustomerId: customer })).consumed === 2,
        "the other instance counting both events",
      );
    });
  }

  it("a published change of an unreadable aggregate is counted and not taken", async () => {
    // Taken, the bucket read as absent: its event no longer counted (the balance read above the
    // hash's), and the copy, at the forged revision, ignored the genuine change of that revision.
    const customer = uniqueCustomer();
    const a = w.connect();
    await a.track("api_call", { externalCustomerId: customer });
    assert.equal((await a.balance(w.calls, { externalCustomerId: customer })).consumed, 1);
    await eventually(async () => a.subscribed, "the subscription");
    const client = w.redis.client();
    try {
      const [state] = (await client.keys(`outpost:v2:*:external:${customer}:*`)).filter(
        (key) => !key.includes(":ev:") && !key.endsWith(":acked"),
      );
      assert.ok(state !== undefined);
      const fields = await client.hgetall(state);
      const [bucket] = Object.keys(fields).filter((name) => name.startsWith("a:"));
      assert.ok(bucket !== undefined);
      const forged = { k: state, r: Number(fields.rev) + 1, s: [bucket, "x y z"] };
      const shard = Number(/\{(\d+)\}/.exec(state)?.[1]);
      await client.call("SPUBLISH", channel(shard), JSON.stringify({ c: [forged] }));
    } finally {
      client.disconnect();
    }
    await eventually(async () => (a.rejections.change ?? 0) >= 1, "a rejection");
    assert.equal((await a.balance(w.calls, { externalCustomerId: customer })).consumed, 1);
    await a.track("api_call", { externalCustomerId: customer });
    assert.equal((await a.balance(w.calls, { externalCustomerId: customer })).consumed, 2);
    assert.equal(a.rejections.state ?? 0, 0); // the hash itself holds no garbage
  });
});
