/** The deployment's shard count (outpost_core's tests/core/test_shards.py, the same rules): what
 * an instance accepts from Redis, what the first one stores, and a core of 64 shards. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Delivery, makeDeliverySettings } from "../../src/core/delivery.js";
import { ConfigurationError } from "../../src/core/errors.js";
import { Customer, MAX_SHARDS, SHARDS_KEY, channel, outboxKey, stateKey } from "../../src/core/keys.js";
import { Session, makeSettings } from "../../src/core/session.js";
import { checkedShards, firstCount, parseShards, shardsDisagreement } from "../../src/core/shards.js";
import { answerAt, effectAt } from "../support/deliveryLoop.js";

const te = new TextEncoder();
const CONFIGURATION = {
  organization_id: "org",
  reducers: [{ id: "r-count", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "count" }, meter_ids: ["m-count"] }],
};

describe("the deployment's shard count", () => {
  it("takes a count from 1 to 1024 and refuses any other", () => {
    for (const count of [1, 16, 64, MAX_SHARDS]) assert.equal(checkedShards(count), count);
    for (const [count, said] of [
      [0, "shards must be from 1 to 1024, not 0"],
      [1025, "shards must be from 1 to 1024, not 1025"],
      [16.5, "shards must be an integer, not 16.5"],
      ["64", "shards must be an integer, not string"],
      [true, "shards must be an integer, not boolean"],
    ] as const) {
      assert.throws(() => checkedShards(count), (exc: unknown) => exc instanceof ConfigurationError && exc.message === said);
    }
    assert.throws(() => makeSettings({ shards: 0 }), ConfigurationError);
    assert.throws(() => makeDeliverySettings({ shards: 2000 }), ConfigurationError);
  });

  it("reads what Redis stores, and nothing else", () => {
    assert.equal(parseShards("64"), 64);
    assert.equal(parseShards(te.encode("1024")), 1024);
    for (const raw of [null, "", "0", "1025", "-3", "16.0", " 16", "١٦", 16, "9".repeat(99), new Uint8Array([0xff])]) assert.equal(parseShards(raw), null, String(raw));
  });

  it("stores its own count first, unless instances that could not choose one left their streams", () => {
    assert.equal(firstCount(64, false), 64);
    assert.equal(firstCount(64, true), 16);
  });

  it("refuses another count naming both, and an unreadable one quoted printably", () => {
    assert.equal(shardsDisagreement(64, "64"), null);
    const why = shardsDisagreement(64, te.encode("16")) as string;
    assert.ok(why.startsWith(`this instance is configured for 64 shards but the deployment's Redis holds 16 shards at ${SHARDS_KEY}:`), why);
    const odd = shardsDisagreement(16, "\u001b[31m" + "x".repeat(200)) as string;
    assert.ok(odd.includes("an unreadable shard count (\\x1b[31mxxx") && odd.includes("more characters") && !odd.includes("\u001b"), odd);
  });

  it("writes each customer under its shard of 64 in a session of 64 shards", () => {
    const session = new Session(makeSettings({ shards: 64 }));
    session.handle({ kind: "ConfigurationReceived", payload: CONFIGURATION, fromCache: false });
    const run = session.track({ name: "a", externalCustomerId: "c2", timestampUs: 1, nowUs: 1, eventId: "e" });
    assert.equal(run.keys[0], outboxKey(48));
    assert.ok(run.keys.includes(stateKey(new Customer("external", "c2"), "r-count", 64)));
    assert.equal(run.args[0], channel(48));
    session.handle({ kind: "SubscriptionConfirmed", count: 16 });
    assert.equal(session.subscribed, false); // 16 of 64
    session.handle({ kind: "SubscriptionConfirmed", count: 64 });
    assert.equal(session.subscribed, true);
    const narrow = new Session();
    narrow.handle({ kind: "ChannelSubscribed", channel: channel(40) });
    assert.equal(narrow.rejections.get("subscription"), 1); // none of a 16-shard deployment's
  });

  it("delivers the entries of shard 40 in a loop of 64 shards, and takes none in a loop of 16", () => {
    const wide = outboxKey(40);
    const entry: [string, string, Map<string, string>] = [
      wide,
      "1-0",
      new Map([
        ["e", JSON.stringify({ name: "a", external_id: "e1" })],
        ["f", "0:e1"],
        ["k", JSON.stringify(["outpost:v2:{40}:external:x:r"])],
      ]),
    ];
    for (const shards of [64, 16]) {
      const delivery = new Delivery(makeDeliverySettings({ linger: 0, shards }), { random: () => 0.5 }, 0);
      assert.equal(effectAt(delivery, 0).kind, "ClaimStale");
      answerAt(delivery, { kind: "OutboxRead", entries: [] }, 0, 0);
      assert.equal(effectAt(delivery, 0).kind, "ReadOutbox");
      answerAt(delivery, { kind: "OutboxRead", entries: [entry] }, 0, 0);
      assert.equal(delivery.rejectedEntries, shards === 64 ? 0 : 1);
      if (shards === 16) continue;
      assert.equal(effectAt(delivery, 0).kind, "PostBatch");
      answerAt(delivery, { kind: "BatchAnswered", status: 200, body: te.encode(""), retryAfter: null }, 0, 0);
      const settle = effectAt(delivery, 0);
      assert.ok(settle.kind === "SettleScript" && settle.keys[0] === wide && settle.args[0] === channel(40));
    }
  });
});
