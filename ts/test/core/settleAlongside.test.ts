/** Settling a batch while the next one is posted (settleAlongside; tests/core/test_settle_alongside.py
 * has the same cases). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { AlongsideLoop, ok, posted, read, SETTLED } from "../support/alongsideLoop.js";
import { type DeliveryEffect, makeDeliverySettings, nothingDone } from "../../src/core/delivery.js";
import { answerAt, effectAt } from "../support/deliveryLoop.js";

const te = new TextEncoder();

/** The event fields a settle script (or each of several) settles. */
function settled(action: DeliveryEffect): string[][] {
  const settles = action.kind === "PostAndSettle" || action.kind === "SettleScripts" ? action.settles : action.kind === "SettleScript" ? [action] : [];
  return settles.map((s) => s.args.filter((a) => a.startsWith("0:")).map((a) => a.slice(2)));
}

const Loop = AlongsideLoop;

describe("settling alongside the next post", () => {
  it("is off by default: a batch settles before the loop reads on", () => {
    assert.equal(makeDeliverySettings().settleAlongside, false);
    const loop = new Loop({ batchSize: 2, settleAlongside: false });
    assert.equal(loop.next().kind, "ReadOutbox");
    assert.deepEqual(posted(loop.step(read("a", "b", "c", "d"))), ["a", "b"]);
    const after = loop.step(ok);
    assert.equal(after.kind, "SettleScript");
  });

  it("posts the next batch while the last one settles, then settles the last alone", () => {
    const loop = new Loop({ batchSize: 2 });
    loop.next();
    assert.deepEqual(posted(loop.step(read("a", "b", "c", "d"))), ["a", "b"]);
    const both = loop.step(ok);
    assert.equal(both.kind, "PostAndSettle");
    assert.deepEqual([posted(both), settled(both)], [["c", "d"], [["a", "b"]]]);
    assert.equal(loop.delivery.idle, false); // c and d are not settled yet
    // Nothing more to post: one read without blocking for a batch to carry the settle, then the
    // settle alone, at once.
    assert.deepEqual(loop.step(ok), { kind: "ReadOutbox", count: 2, block: 0 });
    const alone = loop.step({ kind: "OutboxRead", entries: [] });
    assert.equal(alone.kind, "SettleScripts");
    assert.deepEqual(settled(alone), [["c", "d"]]);
    assert.deepEqual(loop.step(SETTLED), { kind: "ReadOutbox", count: 2, block: 0.5 });
    assert.equal(loop.delivery.idle, true);
    assert.equal(loop.delivery.delivered, 4);
  });

  it("never holds a settle back for a batch not due yet", () => {
    const loop = new Loop({ batchSize: 5, linger: 0.2 });
    loop.next();
    answerAt(loop.delivery, read("a"), 0, 1);
    loop.now = 0.2;
    assert.deepEqual(posted(loop.next()), ["a"]);
    loop.now = 0.21;
    assert.deepEqual(loop.step(ok), { kind: "ReadOutbox", count: 5, block: 0 });
    // The read finds b, which lingers: the settle goes alone, not after it.
    const alone = loop.step(read("b"));
    assert.equal(alone.kind, "SettleScripts");
    assert.deepEqual(settled(alone), [["a"]]);
    assert.deepEqual(loop.step(SETTLED), { kind: "Sleep", until: 0.235 });
  });

  it("takes a request from the budget before the post that carries the settle; settles first when the budget makes it wait", () => {
    const loop = new Loop({ batchSize: 1, requestsPerMinute: 300 });
    loop.next();
    assert.equal(loop.step(read("a", "b", "c")).kind, "TakeRequest");
    assert.deepEqual(posted(loop.step({ kind: "BudgetAnswered", reply: 0 })), ["a"]);
    assert.equal(loop.step(ok).kind, "TakeRequest");
    // 200 ms to wait for the next request: the settle does not wait for it.
    const alone = loop.step({ kind: "BudgetAnswered", reply: 200_000 });
    assert.equal(alone.kind, "SettleScripts");
    assert.deepEqual(settled(alone), [["a"]]);
    answerAt(loop.delivery, SETTLED, 0, 1);
    loop.now = 0.2;
    assert.deepEqual(posted(loop.next()), ["b", "c"]); // having waited, it carries all that was read
  });

  it("reports nothing done while closing", () => {
    const post = { kind: "PostBatch" as const, body: te.encode("{}"), size: 1 };
    const failed = { kind: "BatchFailed", reason: "the instance closed", maybeSent: true };
    assert.deepEqual(nothingDone(post), failed);
    assert.deepEqual(nothingDone({ kind: "PostAndSettle", post, settles: [] }), failed);
    assert.deepEqual(nothingDone({ kind: "SettleScripts", settles: [] }), SETTLED);
  });
});
