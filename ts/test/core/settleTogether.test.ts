/** Settling the entries of several batches in one script (settleEvery;
 * tests/core/test_settle_together.py has the same cases). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { AlongsideLoop, answer, entry, ok, posted, read, SETTLED, STREAM } from "../support/alongsideLoop.js";
import { type DeliveryEffect, makeDeliverySettings } from "../../src/core/delivery.js";
import { UsageError } from "../../src/core/errors.js";
import { BUDGET_KEY } from "../../src/core/keys.js";
import { answerAt, effectAt } from "../support/deliveryLoop.js";

const OTHER = "outpost:v2:{5}:outbox";

/** Each settle script an action runs: its script, stream, entry ids and event fields. */
function settled(action: DeliveryEffect): [string, string, string[], string[]][] {
  const settles = action.kind === "PostAndSettle" || action.kind === "SettleScripts" ? action.settles : action.kind === "SettleScript" ? [action] : [];
  return settles.map((s) => [
    s.script,
    s.keys[0] as string,
    s.args.slice(4, 4 + Number(s.args[3])),
    s.args.filter((a) => a.startsWith("0:")).map((a) => a.slice(2)),
  ]);
}

const ids = (...names: string[]): string[] => names.map((n) => `${n.charCodeAt(0)}-0`);

/** A loop past its first claim, settling alongside and four acknowledged entries together. */
class Loop extends AlongsideLoop {
  constructor(overrides = {}) {
    super({ settleEvery: 4, ...overrides });
  }
}

describe("settling acknowledged entries together", () => {
  it("is off by default and never negative", () => {
    assert.equal(makeDeliverySettings().settleEvery, 0);
    assert.throws(() => makeDeliverySettings({ settleEvery: -1 }), (e: unknown) => e instanceof UsageError && /settle_every/.test(e.message));
  });

  it("settles batches that follow each other in one script", () => {
    const loop = new Loop({ batchSize: 2 });
    assert.equal(loop.next().kind, "ReadOutbox");
    assert.deepEqual(posted(loop.step(read("a", "b", "c", "d", "e", "f"))), ["a", "b"]);
    // c and d go at once: a and b wait for them rather than settle alone.
    const second = loop.step(ok);
    assert.equal(second.kind, "PostBatch");
    assert.deepEqual(posted(second), ["c", "d"]);
    assert.equal(loop.delivery.idle, false);
    // Four are held: one script settles them, while e and f are posted.
    const both = loop.step(ok);
    assert.equal(both.kind, "PostAndSettle");
    assert.deepEqual(posted(both), ["e", "f"]);
    assert.deepEqual(settled(both), [["acknowledge", STREAM, ids("a", "b", "c", "d"), ["a", "b", "c", "d"]]]);
    answerAt(loop.delivery, ok, loop.now, 1);
    assert.equal(loop.delivery.delivered, 6);
  });

  it("settles one script per stream", () => {
    const loop = new Loop({ batchSize: 2 });
    loop.next();
    const entries = [entry("a"), entry("b", OTHER), entry("c", OTHER), entry("d", OTHER), entry("e")];
    assert.deepEqual(posted(loop.step({ kind: "OutboxRead", entries })), ["a", "b"]);
    assert.deepEqual(posted(loop.step(ok)), ["c", "d"]);
    // One entry of the first stream is less than a batch: the other stream's script goes with it.
    const both = loop.step(ok);
    assert.deepEqual(posted(both), ["e"]);
    assert.deepEqual(settled(both), [
      ["acknowledge", STREAM, ids("a"), ["a"]],
      ["acknowledge", OTHER, ids("b", "c", "d"), ["b", "c", "d"]],
    ]);
  });

  it("settles acknowledged entries at once when no batch goes next", () => {
    const loop = new Loop({ batchSize: 2 });
    loop.next();
    assert.deepEqual(posted(loop.step(read("a", "b"))), ["a", "b"]);
    assert.deepEqual(loop.step(ok), { kind: "ReadOutbox", count: 2, block: 0 }); // for a batch to carry it
    const alone = loop.step({ kind: "OutboxRead", entries: [] });
    assert.equal(alone.kind, "SettleScripts");
    assert.deepEqual(settled(alone), [["acknowledge", STREAM, ids("a", "b"), ["a", "b"]]]);
    answerAt(loop.delivery, SETTLED, loop.now, 1);
    assert.equal(loop.delivery.idle, true);
  });

  it("holds no settle back behind a batch waiting to be retried", () => {
    const loop = new Loop({ batchSize: 2 });
    loop.next();
    assert.deepEqual(posted(loop.step(read("a", "b", "c", "d", "e", "f"))), ["a", "b"]);
    const second = loop.step(ok);
    assert.equal(second.kind, "PostBatch");
    assert.deepEqual(posted(second), ["c", "d"]);
    const alone = loop.step(answer(503)); // c and d wait their backoff
    assert.equal(alone.kind, "SettleScripts");
    assert.deepEqual(settled(alone), [["acknowledge", STREAM, ids("a", "b"), ["a", "b"]]]);
  });

  it("holds no settle back behind a request the budget makes wait", () => {
    const loop = new Loop({ batchSize: 2, requestsPerMinute: 300 });
    loop.next();
    assert.equal(loop.step(read("a", "b", "c", "d")).kind, "TakeRequest");
    assert.deepEqual(posted(loop.step({ kind: "BudgetAnswered", reply: 0 })), ["a", "b"]);
    assert.deepEqual(loop.step(ok), { kind: "TakeRequest", key: BUDGET_KEY, perMinute: 300, capacity: 20 });
    const alone = loop.step({ kind: "BudgetAnswered", reply: 10_000 });
    assert.equal(alone.kind, "SettleScripts");
    assert.deepEqual(settled(alone), [["acknowledge", STREAM, ids("a", "b"), ["a", "b"]]]);
    assert.notEqual(loop.step(SETTLED).kind, "PostBatch"); // c and d wait for their request
  });

  it("carries about one batch of settles beside each post, the rest beside the next", () => {
    // Four batches' settles beside one post kept the next post waiting (Redis settles them more
    // slowly than Polar stores a batch): a batch's worth goes at a time, each stream's script whole.
    const loop = new Loop({ batchSize: 2 });
    assert.equal(loop.next().kind, "ReadOutbox");
    const found = [entry("a"), entry("b", OTHER), entry("c"), entry("d", OTHER), ...["e", "f", "g", "h", "i", "j"].map((n) => entry(n))];
    assert.deepEqual(posted(loop.step({ kind: "OutboxRead", entries: found })), ["a", "b"]);
    assert.deepEqual(posted(loop.step(ok)), ["c", "d"]);
    const first = loop.step(ok);
    assert.equal(first.kind, "PostAndSettle");
    assert.deepEqual(posted(first), ["e", "f"]);
    assert.deepEqual(settled(first), [["acknowledge", STREAM, ids("a", "c"), ["a", "c"]]]);
    const next = loop.step(ok);
    assert.equal(next.kind, "PostAndSettle");
    assert.deepEqual(posted(next), ["g", "h"]);
    assert.deepEqual(settled(next), [["acknowledge", OTHER, ids("b", "d"), ["b", "d"]]]);
    answerAt(loop.delivery, ok, loop.now, 1);
    assert.equal(loop.delivery.delivered, 8);
  });

  it("carries every settle left beside the last batch known", () => {
    // A flush ended with the entries of its last few batches settling alone after its last post:
    // a batch that empties the buffer, with no read finding more, carries every settle queued and
    // every acknowledged entry held (no later post would carry them).
    const loop = new Loop({ batchSize: 2 });
    loop.next();
    const found = [entry("a"), entry("b", OTHER), entry("c"), entry("d", OTHER), ...["e", "f", "g", "h"].map((n) => entry(n))];
    assert.deepEqual(posted(loop.step({ kind: "OutboxRead", entries: found })), ["a", "b"]);
    loop.step(ok); // c, d
    loop.step(ok); // e, f: four held, two scripts queued, the first beside e and f
    const last = loop.step(ok);
    assert.equal(last.kind, "PostAndSettle");
    assert.deepEqual(posted(last), ["g", "h"]);
    assert.deepEqual(settled(last), [
      ["acknowledge", OTHER, ids("b", "d"), ["b", "d"]],
      ["acknowledge", STREAM, ids("e", "f"), ["e", "f"]],
    ]);
    // Only the last batch's own settle is left once its answer came.
    assert.deepEqual(loop.step(ok), { kind: "ReadOutbox", count: 2, block: 0 });
    const alone = loop.step({ kind: "OutboxRead", entries: [] });
    assert.deepEqual(settled(alone), [["acknowledge", STREAM, ids("g", "h"), ["g", "h"]]]);
    answerAt(loop.delivery, SETTLED, loop.now, 1);
    assert.equal(loop.delivery.idle, true);
  });

  it("carries one batch of settles beside a batch after which a read found more", () => {
    const loop = new Loop({ batchSize: 2, readAlongside: true });
    assert.deepEqual(loop.next(), { kind: "ReadOutbox", count: 1, block: 0.5 }); // each stream's share
    const first = loop.step(read("a", "b")); // its stream gave all it was asked: more may wait
    assert.equal(first.kind, "PostAndSettle");
    assert.deepEqual(posted(first), ["a", "b"]);
    const next = loop.step({ kind: "PostedAlongside", answer: { kind: "BatchAnswered", status: 200, body: new Uint8Array(), retryAfter: null }, read: { kind: "OutboxRead", entries: [entry("c"), entry("d")] } });
    // c and d empty the buffer, but the read gave all it was asked: a and b wait for more.
    assert.equal(next.kind, "PostAndSettle");
    assert.deepEqual(posted(next), ["c", "d"]);
    assert.deepEqual(settled(next), []);
  });

  it("carries nothing beside the last batch without settling alongside", () => {
    const loop = new Loop({ batchSize: 2, settleAlongside: false });
    loop.next();
    assert.deepEqual(posted(loop.step(read("a", "b", "c", "d"))), ["a", "b"]);
    const next = loop.step(ok); // a, b: held to settle with the next
    assert.equal(next.kind, "PostBatch");
    assert.deepEqual(posted(next), ["c", "d"]);
  });
});
