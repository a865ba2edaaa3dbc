/** Liveness (heartbeats, surveys, reclaim), the request budget and batch bytes in the delivery
 * loop, without I/O; and the small policies beside them (backoff, outage reports, echoes). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { backoff } from "../../src/core/backoff.js";
import { MAX_WAIT, capacity, take, waitOf } from "../../src/core/budget.js";
import { type DeliveryEffect, Delivery, type DeliveryInput, makeDeliverySettings, nothingDone } from "../../src/core/delivery.js";
import { Echoes } from "../../src/core/echoes.js";
import { UsageError } from "../../src/core/errors.js";
import { BUDGET_KEY, allOutboxes, heartbeatKey } from "../../src/core/keys.js";
import { beat, check, consumersOf, handBack, reclaims, takenEntries } from "../../src/core/liveness.js";
import { Outage } from "../../src/core/outage.js";
import { answerAt, effectAt } from "../support/deliveryLoop.js";

const STREAM = "outpost:v2:{3}:outbox";
const fields = (n: number, item = JSON.stringify({ name: "a", external_id: `e${n}` })): Map<string, string> =>
  new Map([
    ["e", item],
    ["f", `0:e${n}`],
    ["k", JSON.stringify(["outpost:v2:{3}:external:x:r"])],
  ]);
const half = { random: () => 0.5 };

/** Poll, check the action's kind, answer it. */
function step(delivery: Delivery, now: number, kind: DeliveryEffect["kind"], outcome: DeliveryInput): DeliveryEffect {
  const action = effectAt(delivery, now);
  assert.equal(action.kind, kind);
  answerAt(delivery, outcome, now, 0);
  return action;
}

describe("liveness", () => {
  it("beats, surveys, checks the others' heartbeats and takes what dead ones hold", () => {
    const delivery = new Delivery(makeDeliverySettings({ consumer: "me", heartbeat: 4, linger: 0 }), half, 0);
    assert.deepEqual(step(delivery, 0, "Beat", { kind: "Done" }), { kind: "Beat", key: heartbeatKey("me"), ttlMs: 4000 });
    const listing: [string, unknown][] = [
      [STREAM, [["name", "me"], ["name", "dead"], ["name", "alive"]]],
      ["outpost:v2:{4}:outbox", [{ name: "dead" }, new Map([["name", "gone"]]), { nothing: 1 }]],
      ["not-an-outbox", []],
    ];
    step(delivery, 0, "SurveyConsumers", { kind: "ConsumersListed", listing });
    assert.equal(delivery.rejectedEntries, 1);
    const checked = step(delivery, 0, "CheckHeartbeats", { kind: "HeartbeatsChecked", values: [null, "1", null] });
    assert.deepEqual(checked, { kind: "CheckHeartbeats", keys: ["alive", "dead", "gone"].map(heartbeatKey) });
    const [first, second] = [effectAt(delivery, 0), null];
    assert.deepEqual(first, { kind: "Reclaim", stream: STREAM, taker: "me", count: 500, consumers: ["alive"] });
    answerAt(delivery, { kind: "Reclaimed", stream: STREAM, reply: JSON.stringify({ e: [["1-0", ["e", '{"external_id":"e1"}', "f", "0:e1", "k", '["s"]']]], d: ["alive"] }) }, 0, 0);
    assert.equal(delivery.consumersRemoved, 1);
    assert.equal(second, null);
    step(delivery, 0, "Reclaim", { kind: "Reclaimed", stream: "outpost:v2:{4}:outbox", reply: "not json" });
    assert.equal(delivery.rejectedEntries, 2);
    assert.equal(effectAt(delivery, 0).kind, "ClaimStale"); // then delivery as usual, with the taken entry
    answerAt(delivery, { kind: "OutboxRead", entries: [] }, 0, 0);
    assert.equal(effectAt(delivery, 0).kind, "PostBatch");
    answerAt(delivery, { kind: "BatchFailed", reason: "x", maybeSent: false }, 0, 0);
    assert.equal(effectAt(delivery, 1).kind, "Beat"); // a quarter of the heartbeat later
  });

  it("takes nothing on a wrong answer, and reads reclaim's replies strictly", () => {
    const consumers = new Map([[STREAM, new Set(["a"])]]);
    assert.deepEqual(reclaims(consumers, ["a"], [null, null], "me", 5), [[], 1]);
    assert.deepEqual(reclaims(consumers, ["a"], "x", "me", 5), [[], 1]);
    assert.equal(check(new Map()), null);
    assert.deepEqual(consumersOf([[STREAM, { name: new Uint8Array([0xff]) }]], "me", 16), [new Map(), 1]);
    const taken = (reply: unknown) => takenEntries({ kind: "Reclaimed", stream: STREAM, reply });
    assert.deepEqual(taken('{"e":{},"d":{}}'), [[], 0]);
    assert.deepEqual(taken(new TextEncoder().encode('{"e":[],"d":["a","b"]}')), [[], 2]);
    for (const bad of [42, "[]", '{"e":1,"d":[]}', '{"e":[["1-0"]],"d":[]}', '{"e":[[1,[]]],"d":[]}', '{"e":[["1-0",["a"]]],"d":[]}']) {
      assert.equal(taken(bad), null, String(bad));
    }
    assert.equal(beat("me", 0.0005).ttlMs, 1);
    assert.equal(beat("me", 0.0025).ttlMs, 2); // Python's round(): half to even
    assert.equal(beat("me", 0.0035).ttlMs, 4);
    const back = handBack("me", 16);
    assert.deepEqual(back[0], { kind: "ForgetHeartbeat", key: heartbeatKey("me") });
    assert.equal(back.length, 1 + allOutboxes().length);
    assert.equal(handBack("me", 64).length, 1 + 64);
  });

  it("says what a closing instance did not do: nothing, so the work stays in Redis", () => {
    const cases: [DeliveryEffect, DeliveryInput["kind"]][] = [
      [{ kind: "ReadOutbox", count: 1, block: 0 }, "OutboxRead"],
      [{ kind: "ClaimStale", minIdle: 1, count: 1 }, "OutboxRead"],
      [{ kind: "SurveyConsumers" }, "ConsumersListed"],
      [{ kind: "CheckHeartbeats", keys: ["a", "b"] }, "HeartbeatsChecked"],
      [{ kind: "Reclaim", stream: STREAM, taker: "", count: 0, consumers: [] }, "Reclaimed"],
      [take(60), "BudgetAnswered"],
      [{ kind: "SettleScript", script: "confirm", keys: [], args: [] }, "Settled"],
      [{ kind: "Beat", key: "k", ttlMs: 1 }, "Done"],
    ];
    for (const [action, kind] of cases) assert.equal(nothingDone(action).kind, kind);
    assert.deepEqual(nothingDone({ kind: "CheckHeartbeats", keys: ["a", "b"] }), { kind: "HeartbeatsChecked", values: ["1", "1"] });
  });
});

describe("the request budget", () => {
  it("sizes the bucket and reads the script's wait", () => {
    assert.deepEqual(take(300), { kind: "TakeRequest", key: BUDGET_KEY, perMinute: 300, capacity: 20 });
    assert.equal(capacity(1), 1);
    const wait = (reply: unknown) => waitOf({ kind: "BudgetAnswered", reply });
    assert.equal(wait(0), 0);
    assert.equal(wait(250_000), 0.25);
    assert.equal(wait(" 1_000_000 "), 1);
    assert.equal(wait(new TextEncoder().encode("500000")), 0.5);
    assert.equal(wait(BigInt(2e8)), MAX_WAIT);
    for (const bad of [-1, 1.5, "x", true, null]) assert.equal(wait(bad), null);
  });

  it("waits for the request it took, reading on meanwhile, then posts", () => {
    const delivery = new Delivery(makeDeliverySettings({ requestsPerMinute: 60, linger: 0, batchBytes: 1024 }), half, 0);
    step(delivery, 0, "ClaimStale", { kind: "OutboxRead", entries: [] });
    step(delivery, 0, "ReadOutbox", { kind: "OutboxRead", entries: [[STREAM, "1-0", fields(1)]] });
    step(delivery, 0, "TakeRequest", { kind: "BudgetAnswered", reply: "garbage" }); // counted, then it goes
    assert.equal(delivery.rejectedEntries, 1);
    assert.equal(effectAt(delivery, 0).kind, "PostBatch");
    answerAt(delivery, { kind: "BatchAnswered", status: 503, body: new Uint8Array(), retryAfter: null }, 0, 0);
    assert.deepEqual(effectAt(delivery, 0), { kind: "Sleep", until: 0.375 });
    answerAt(delivery, { kind: "Done" }, 0.375, 0);
    step(delivery, 0.375, "RefreshClaim", { kind: "Done" });
    step(delivery, 0.375, "TakeRequest", { kind: "BudgetAnswered", reply: 2_000_000 });
    assert.deepEqual(effectAt(delivery, 1), { kind: "Sleep", until: 2.375 }); // a batch waits: sleep
    answerAt(delivery, { kind: "Done" }, 2.375, 0);
    assert.equal(effectAt(delivery, 2.375).kind, "PostBatch");
    answerAt(delivery, { kind: "BatchAnswered", status: 200, body: new Uint8Array(), retryAfter: null }, 2.375, 0);
    step(delivery, 2.375, "SettleScript", { kind: "Settled", reply: null });
    // A buffer waiting for its request reads on, until the batch is full.
    step(delivery, 3, "ReadOutbox", { kind: "OutboxRead", entries: [[STREAM, "2-0", fields(2)]] });
    step(delivery, 3, "TakeRequest", { kind: "BudgetAnswered", reply: 1_000_000 });
    const read = effectAt(delivery, 3.25);
    assert.deepEqual(read, { kind: "ReadOutbox", count: 500, block: 0.5 });
    const big = (n: number, pad: number) => JSON.stringify({ external_id: `e${n}`, pad: "x".repeat(pad) });
    answerAt(delivery, { kind: "OutboxRead", entries: [[STREAM, "3-0", fields(3, big(3, 980))], [STREAM, "4-0", fields(4, big(4, 1100))]] }, 3.25, 0);
    const report = effectAt(delivery, 3.25); // too large for any batch: dropped, reported
    assert.equal(report.kind === "ReportDropped" && report.reason, "larger than an ingestion request may be (1024 bytes)");
    answerAt(delivery, { kind: "Reported" }, 3.25, 0);
    step(delivery, 3.25, "SettleScript", { kind: "Settled", reply: null });
    assert.deepEqual(effectAt(delivery, 3.5), { kind: "Sleep", until: 4 }); // full: no more reading
    answerAt(delivery, { kind: "Done" }, 4, 0);
    const post = effectAt(delivery, 4); // as many as the bytes allow: the first, then the big one alone
    assert.equal(post.kind === "PostBatch" && post.size, 1);
  });

  it("stalls on a set-up no retry fixes, and drops an unreadable event's raw text", () => {
    const delivery = new Delivery(makeDeliverySettings({ linger: 0 }), half, 0);
    step(delivery, 0, "ClaimStale", { kind: "OutboxRead", entries: [] });
    step(delivery, 0, "ReadOutbox", { kind: "OutboxRead", entries: [[STREAM, "1-0", fields(1, "{not json}")]] });
    step(delivery, 0, "PostBatch", { kind: "BatchFailed", reason: "certificate", maybeSent: false, stalls: true });
    assert.equal(delivery.stalled, "certificate");
    assert.ok(delivery.blocked);
    assert.deepEqual(effectAt(delivery, 0), { kind: "Sleep", until: 30 });
    answerAt(delivery, { kind: "Done" }, 30, 0);
    assert.equal(effectAt(delivery, 30).kind, "RefreshClaim");
    answerAt(delivery, { kind: "Done" }, 30, 0);
    step(delivery, 30, "PostBatch", { kind: "BatchAnswered", status: 400, body: new Uint8Array(), retryAfter: null });
    const report = effectAt(delivery, 30);
    assert.deepEqual(report.kind === "ReportDropped" && report.events, [{ unreadable: "{not json}" }]);
  });

  it("refuses settings that make no sense", () => {
    for (const bad of [{ heartbeat: 0 }, { requestsPerMinute: -1 }, { batchBytes: 10 }]) {
      assert.throws(() => makeDeliverySettings(bad), UsageError);
    }
  });
});

describe("small policies", () => {
  it("backs off exponentially, with equal jitter, up to the cap", () => {
    assert.equal(backoff(1, 1, 10, 0), 0.5);
    assert.equal(backoff(3, 1, 10, 0.999), 4 * (0.5 + 0.5 * 0.999));
    assert.equal(backoff(10, 1, 10, 1), 10);
    assert.throws(() => backoff(0, 1, 10, 0), UsageError);
  });

  it("reports an outage once, reminds every minute, and says when it ends", () => {
    const outage = new Outage("delivery 0");
    assert.equal(outage.succeeded(0), null);
    const [delay, first] = outage.failed(10, "refused", 0);
    assert.equal(delay, 0.025);
    assert.deepEqual(first, { level: "warning", message: "outpost: Redis unreachable for delivery 0: refused" });
    assert.equal(outage.failed(20, "refused", 0)[1], null);
    assert.equal(outage.failed(70, "refused", 0)[1]?.message, "outpost: Redis still unreachable for delivery 0 after 60 s: refused");
    assert.ok(outage.down);
    assert.deepEqual(outage.succeeded(71.3), { level: "info", message: "outpost: Redis is back for delivery 0 after 61.3 s" });
    assert.equal(outage.down, false);
    const polar = new Outage("the WebSocket", "Polar");
    assert.equal(polar.failed(0, "refused", 0)[1]?.message, "outpost: Polar unreachable for the WebSocket: refused");
    assert.equal(polar.succeeded(2)?.message, "outpost: Polar is back for the WebSocket after 2.0 s");
  });

  it("recognises an echo once, and forgets the oldest beyond its size", () => {
    const echoes = new Echoes(2);
    echoes.expect("a");
    echoes.expect(new TextEncoder().encode("b"));
    echoes.expect(42);
    echoes.expect("a");
    assert.equal(echoes.length, 2);
    assert.equal(echoes.seen("b"), false); // bytes are not the text
    echoes.expect("c"); // "a" goes
    assert.equal(echoes.seen("a"), false);
    assert.equal(echoes.seen(new TextEncoder().encode("b")), true);
    assert.equal(echoes.seen(new TextEncoder().encode("b")), false);
    assert.equal(echoes.seen(null), false);
  });
});
