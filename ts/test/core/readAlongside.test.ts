/** Reading the next batch while one is posted (readAlongside), and reads sized to about one batch
 * across the streams that hold entries (tests/core/test_read_alongside.py has the same cases). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  type BatchAnswered,
  type DeliveryEffect,
  type DeliveryInput,
  type DeliverySettings,
  Delivery,
  GROUP,
  type OutboxRead,
  type PostBatch,
  type PostedAlongside,
  type ReadOutbox,
  type SettleScript,
  makeDeliverySettings,
  nothingDone,
} from "../../src/core/delivery.js";
import { UsageError } from "../../src/core/errors.js";
import { ackedKey, allOutboxes, channel } from "../../src/core/keys.js";
import { answerAt, effectAt } from "../support/deliveryLoop.js";

const STREAM = allOutboxes()[3] as string;
const OTHER = allOutboxes()[7] as string;
const BUCKET = 1_796_223_600_000_000;
const WALL = BUCKET + 5_000_000;
const ST1 = "outpost:v2:{3}:external:c1:r1";
const te = new TextEncoder();

const item = (id: string): string => JSON.stringify({ name: "api_call", external_customer_id: "c1", external_id: id });
const entries = (ids: string[], stream = STREAM): OutboxRead["entries"] =>
  ids.map((id) => [stream, `1-${id}`, new Map([["e", item(id)], ["f", `${BUCKET}:${id}`], ["k", JSON.stringify([ST1])]])]);
const outboxRead = (ids: string[] = [], stream = STREAM): OutboxRead => ({ kind: "OutboxRead", entries: entries(ids, stream) });
const ok = (status: number): BatchAnswered => ({ kind: "BatchAnswered", status, body: new Uint8Array(), retryAfter: null });
const readOutbox = (count: number, block: number): ReadOutbox => ({ kind: "ReadOutbox", count, block });
/** The ingestion body: the queued items, as they were queued, in a list. */
const post = (...ids: string[]): PostBatch => ({ kind: "PostBatch", body: te.encode(`{"events":[${ids.map(item).join(",")}]}`), size: ids.length });
/** The post's answer, with what the read beside it found. */
const answered = (status: number, ids: string[] = [], stream = STREAM): PostedAlongside => ({ kind: "PostedAlongside", answer: ok(status), read: outboxRead(ids, stream) });

function settle(script: string, ids: string[], fieldIds: string[], stream = STREAM): SettleScript {
  const args = [channel(allOutboxes().indexOf(stream), ""), GROUP, String(WALL), String(ids.length), ...ids.map((id) => `1-${id}`)];
  const keys = [stream];
  if (fieldIds.length) {
    keys.push(ST1, ackedKey(ST1));
    args.push("-1", String(fieldIds.length), ...fieldIds.map((id) => `${BUCKET}:${id}`));
  }
  return { kind: "SettleScript", script, keys, args };
}

/** Drives a Delivery as a driver's loop does, past its first claim (which found nothing). */
class Loop {
  now = 0;
  readonly delivery: Delivery;
  constructor(overrides: Partial<DeliverySettings> = {}) {
    this.delivery = new Delivery(makeDeliverySettings(overrides), { random: () => 0.5 }, 0);
    assert.deepEqual(this.next(), { kind: "ClaimStale", minIdle: 300, count: this.delivery.settings.batchSize });
    this.report({ kind: "Done" });
  }
  next(): DeliveryEffect {
    return effectAt(this.delivery, this.now);
  }
  report(outcome: DeliveryInput): void {
    answerAt(this.delivery, outcome, this.now, WALL);
  }
  /** The next effect, answered with `outcome`; returns the effect. */
  step(outcome: DeliveryInput): DeliveryEffect {
    const action = this.next();
    this.report(outcome);
    return action;
  }
  read(...ids: string[]): void {
    assert.equal(this.next().kind, "ReadOutbox");
    this.report(outboxRead(ids));
  }
}

const pipelined = (overrides: Partial<DeliverySettings> = {}): Loop => new Loop({ linger: 0, settleAlongside: true, readAlongside: true, ...overrides });

/** The post of `ids`, read first (and found to be all there is). */
function posting(loop: Loop, ...ids: string[]): DeliveryEffect {
  loop.read(...ids);
  let effect = loop.next();
  if (effect.kind === "ReadOutbox") {
    loop.report(outboxRead());
    effect = loop.next();
  }
  return effect;
}

describe("reading the next batch while one is posted", () => {
  it("is off by default: a read asks each stream for a whole batch", () => {
    assert.equal(makeDeliverySettings().readAlongside, false);
    const loop = new Loop({ batchSize: 32, linger: 0 });
    assert.deepEqual(loop.step(outboxRead(["a"])), readOutbox(32, 0.5));
    assert.deepEqual(loop.next(), post("a"));
  });

  it("asks each stream, at first, for its share of a batch", () => {
    // 16 streams: a read for 32 asks each for 3 (an eighth more, as streams give unevenly), so it
    // brings about one batch, not 16.
    const loop = pipelined({ batchSize: 32 });
    assert.deepEqual(loop.next(), readOutbox(3, 0.5));
  });

  it("keeps the spread when no stream gave all it was asked", () => {
    const loop = pipelined({ batchSize: 32 });
    assert.deepEqual(loop.step(outboxRead()), readOutbox(3, 0.5));
    assert.deepEqual(loop.step(outboxRead(["a", "b"])), readOutbox(3, 0.5)); // 2 < 3: none filled
    assert.deepEqual(loop.next(), { kind: "PostAndSettle", post: post("a", "b"), settles: [], read: readOutbox(3, 0) });
  });

  it("reads the next batch while one is posted", () => {
    const loop = pipelined({ batchSize: 4 });
    assert.deepEqual(loop.step({ kind: "OutboxRead", entries: [...entries(["a"]), ...entries(["b"], OTHER)] }), readOutbox(1, 0.5));
    // Both streams gave all they were asked: they may hold more, and a batch that is not full
    // reads again before it goes, each stream asked for its half of what is missing.
    assert.deepEqual(loop.step({ kind: "OutboxRead", entries: [...entries(["c"]), ...entries(["d"], OTHER)] }), readOutbox(1, 0));
    const first = { kind: "PostAndSettle", post: post("a", "b", "c", "d"), settles: [], read: readOutbox(2, 0) };
    assert.deepEqual(loop.step(answered(200, ["e", "f"])), first);
    // One stream gave both: the next read asks it alone for what the batch lacks.
    assert.deepEqual(loop.step(outboxRead()), readOutbox(2, 0));
    const settled = [settle("acknowledge", ["a", "c"], ["a", "c"]), settle("acknowledge", ["b", "d"], ["b", "d"], OTHER)];
    const second = { kind: "PostAndSettle", post: post("e", "f"), settles: settled, read: readOutbox(4, 0) };
    assert.deepEqual(loop.step(answered(200)), second); // found none left: e and f go as they are
    assert.equal(loop.delivery.delivered, 6);
    // Nothing more was found: the settle goes alone, with no second read for the next batch.
    assert.deepEqual(loop.step({ kind: "Settled", reply: null }), { kind: "SettleScripts", settles: [settle("acknowledge", ["e", "f"], ["e", "f"])] });
    assert.equal(loop.delivery.idle, true);
    assert.deepEqual(loop.next(), readOutbox(4, 0.5)); // none filled: spread kept
  });

  it("posts without a read when the buffer holds the next batch already", () => {
    const loop = pipelined({ batchSize: 2 });
    loop.read("a", "b", "c", "d");
    assert.deepEqual(loop.step(ok(200)), post("a", "b"));
    const effect = loop.next();
    assert.equal(effect.kind, "PostAndSettle");
    assert.notEqual(effect.kind === "PostAndSettle" ? effect.read : null, null); // c and d are the last in the buffer: read for more
    loop.report(answered(200));
  });

  it("keeps a batch whose post failed waiting, with what was read beside it", () => {
    const loop = pipelined({ batchSize: 2 });
    assert.equal(posting(loop, "a").kind, "PostAndSettle");
    loop.report({ kind: "PostedAlongside", answer: { kind: "BatchFailed", reason: "reset", maybeSent: false }, read: outboxRead() });
    assert.equal(loop.next().kind, "Sleep"); // Polar unreachable: the batch waits
    assert.equal(loop.delivery.idle, false);
  });

  it("adds what a read beside a failed post found to the buffer", () => {
    const loop = pipelined({ batchSize: 2 });
    assert.equal(posting(loop, "a").kind, "PostAndSettle");
    loop.report({ kind: "PostedAlongside", answer: ok(503), read: outboxRead(["b"]) });
    loop.now = 10;
    const effect = loop.next(); // the batch of a, its claim refreshed before it goes again
    assert.deepEqual(effect, { kind: "RefreshClaim", entries: [[STREAM, "1-a"], [STREAM, "1-b"]] });
  });

  it("has a flush post what the read alongside found", () => {
    const loop = pipelined({ batchSize: 5, linger: 10 });
    loop.delivery.handle({ kind: "Flushing", on: true });
    loop.read("a");
    assert.deepEqual(loop.step(outboxRead()), readOutbox(4, 0)); // the flush's read more
    assert.deepEqual(loop.step(answered(200, ["b"])), { kind: "PostAndSettle", post: post("a"), settles: [], read: readOutbox(5, 0) });
    const effect = loop.next();
    assert.equal(effect.kind, "PostAndSettle");
    assert.deepEqual(effect.kind === "PostAndSettle" ? effect.post : null, post("b"));
  });

  it("takes the answer of a post with a read only with what the read found", () => {
    const loop = pipelined({ batchSize: 2 });
    assert.equal(posting(loop, "a").kind, "PostAndSettle");
    assert.throws(() => loop.report(ok(200)), (exc: unknown) => exc instanceof UsageError && /answered by a PostedAlongside/.test(exc.message));
    loop.report(answered(200, ["b", "c", "d", "e"])); // the machine waits for the right answer
    const effect = loop.next(); // b and c go; d and e are the next batch: no read
    assert.equal(effect.kind, "PostAndSettle");
    assert.equal(effect.kind === "PostAndSettle" ? effect.read : undefined, null);
    assert.throws(() => loop.report(answered(200)), (exc: unknown) => exc instanceof UsageError && /answered by the post's answer alone/.test(exc.message));
  });

  it("answers the read with nothing found when the instance closes", () => {
    const body = post();
    const closed = { kind: "BatchFailed", reason: "the instance closed", maybeSent: true };
    assert.deepEqual(nothingDone({ kind: "PostAndSettle", post: body, settles: [], read: readOutbox(1, 0) }), { kind: "PostedAlongside", answer: closed, read: outboxRead() });
    assert.deepEqual(nothingDone({ kind: "PostAndSettle", post: body, settles: [] }), closed);
    assert.deepEqual(nothingDone({ kind: "PostAndSettle", post: body, settles: [], read: null }), closed);
  });

  it("reports a stall from the answer of a post with a read", () => {
    const loop = pipelined({ batchSize: 2 });
    posting(loop, "a");
    loop.report(answered(401));
    assert.notEqual(loop.delivery.stalled, null);
    assert.deepEqual(
      loop.delivery.reports().map((r) => r.message),
      [`outpost delivery is stalled: ${loop.delivery.stalled}`],
    );
  });
});
