/** The delivery policy without I/O: batching, splitting, retries, waits, stalls, settling. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { type DeliveryEffect, Delivery, type DeliveryInput, type DeliverySettings, makeDeliverySettings, retryAfter, withKnownRevs } from "../../src/core/delivery.js";
import { UsageError } from "../../src/core/errors.js";
import { answerAt, effectAt } from "../support/deliveryLoop.js";

const STREAM = "outpost:v2:{3}:outbox";
const te = new TextEncoder();
const entry = (n: number): [string, string, Map<string, string>] => [
  STREAM,
  `${n}-0`,
  new Map([
    ["e", JSON.stringify({ name: "a", external_id: `e${n}` })],
    ["f", `0:e${n}`],
    ["k", JSON.stringify(["outpost:v2:{3}:external:x:r"])],
  ]),
];
const answered = (status: number, body: unknown = "", retry: number | null = null): DeliveryInput => ({
  kind: "BatchAnswered",
  status,
  body: te.encode(typeof body === "string" ? body : JSON.stringify(body)),
  retryAfter: retry,
});

/** A loop with `n` entries read and its first batch posted. */
function posted(n: number, overrides = {}): [Delivery, DeliveryEffect] {
  const delivery = new Delivery(makeDeliverySettings({ linger: 0, backoffBase: 1, ...overrides }), { random: () => 0.5 }, 0);
  assert.equal(effectAt(delivery, 0).kind, "ClaimStale");
  answerAt(delivery, { kind: "OutboxRead", entries: [] }, 0, 0);
  assert.equal(effectAt(delivery, 0).kind, "ReadOutbox");
  answerAt(delivery, { kind: "OutboxRead", entries: Array.from({ length: n }, (_, i) => entry(i + 1)) }, 0, 0);
  const action = effectAt(delivery, 0);
  assert.equal(action.kind, "PostBatch");
  return [delivery, action];
}
const ids = (action: DeliveryEffect): string[] =>
  action.kind === "PostBatch" ? (JSON.parse(new TextDecoder().decode(action.body)).events as { external_id: string }[]).map((e) => e.external_id) : [];

describe("the delivery policy", () => {
  it("lingers by sleeping, and reads what came every linger / 8 seconds without blocking", () => {
    const delivery = new Delivery(makeDeliverySettings({ linger: 0.2 }), { random: () => 0.5 }, 0);
    assert.equal(effectAt(delivery, 0).kind, "ClaimStale");
    answerAt(delivery, { kind: "OutboxRead", entries: [] }, 0, 0);
    assert.equal(effectAt(delivery, 1).kind, "ReadOutbox");
    answerAt(delivery, { kind: "OutboxRead", entries: [entry(1)] }, 1, 0);
    assert.deepEqual(effectAt(delivery, 1.01), { kind: "Sleep", until: 1.025 });
    answerAt(delivery, { kind: "Done" }, 1.01, 0);
    assert.deepEqual(effectAt(delivery, 1.03), { kind: "ReadOutbox", count: 499, block: 0 });
    answerAt(delivery, { kind: "OutboxRead", entries: [entry(2)] }, 1.03, 0);
    assert.deepEqual(effectAt(delivery, 1.04), { kind: "Sleep", until: 1.055 });
    answerAt(delivery, { kind: "Done" }, 1.04, 0);
    assert.equal(effectAt(delivery, 1.19).kind, "ReadOutbox");
    answerAt(delivery, { kind: "OutboxRead", entries: [] }, 1.19, 0);
    assert.deepEqual(effectAt(delivery, 1.195), { kind: "Sleep", until: 1.2 }); // due first
    answerAt(delivery, { kind: "Done" }, 1.195, 0);
    assert.equal(effectAt(delivery, 1.2).kind, "PostBatch");
  });

  it("still reads every readBlock while a long linger runs", () => {
    const delivery = new Delivery(makeDeliverySettings({ linger: 3600, readBlock: 0.5 }), { random: () => 0.5 }, 0);
    assert.equal(effectAt(delivery, 0).kind, "ClaimStale");
    answerAt(delivery, { kind: "OutboxRead", entries: [entry(1)] }, 0, 0);
    assert.deepEqual(effectAt(delivery, 0), { kind: "Sleep", until: 0.5 });
  });

  it("reads once more when a flush begins, so the flush sends what is queued in one batch", () => {
    const delivery = new Delivery(makeDeliverySettings({ linger: 0.2 }), { random: () => 0.5 }, 0);
    assert.equal(effectAt(delivery, 0).kind, "ClaimStale");
    answerAt(delivery, { kind: "OutboxRead", entries: [entry(1)] }, 0, 0);
    delivery.handle({ kind: "Flushing", on: true });
    assert.deepEqual(effectAt(delivery, 0.001), { kind: "ReadOutbox", count: 499, block: 0 });
    answerAt(delivery, { kind: "OutboxRead", entries: [entry(2)] }, 0.001, 0);
    const post = effectAt(delivery, 0.001);
    assert.deepEqual(ids(post), ["e1", "e2"]);
  });

  it("acknowledges a delivered batch", () => {
    const [delivery] = posted(2);
    answerAt(delivery, answered(200), 1, 5);
    const settle = effectAt(delivery, 1);
    assert.equal(settle.kind, "SettleScript");
    assert.deepEqual(settle.kind === "SettleScript" && settle.args, ["outpost:v2:{3}:changes", "outpost", "5", "2", "1-0", "2-0", "-1", "2", "0:e1", "0:e2"]);
    assert.deepEqual(withKnownRevs(settle as never, () => 7).args.slice(6, 7), ["7"]);
    answerAt(delivery, { kind: "Settled", reply: null }, 1, 5);
    assert.ok(delivery.idle);
    assert.equal(delivery.delivered, 2);
  });

  it("skips a read entry only while the loop holds it, and one read's repeat", () => {
    const [delivery, first] = posted(2, { batchSize: 3 });
    assert.deepEqual(ids(first), ["e1", "e2"]);
    answerAt(delivery, answered(200), 1, 5);
    assert.equal(effectAt(delivery, 1).kind, "SettleScript");
    answerAt(delivery, { kind: "Settled", reply: null }, 1, 5);
    assert.equal(effectAt(delivery, 400).kind, "ClaimStale");
    // e1 was acknowledged: taken again; e3 twice in one answer: taken once.
    answerAt(delivery, { kind: "OutboxRead", entries: [entry(1), entry(3), entry(3)] }, 400, 5);
    let action = effectAt(delivery, 400);
    if (action.kind === "ReadOutbox") {
      answerAt(delivery, { kind: "OutboxRead", entries: [entry(3)] }, 400, 5); // held: skipped
      action = effectAt(delivery, 400);
    }
    assert.deepEqual(ids(action), ["e1", "e3"]);
  });

  it("drops alone what a 422 points at, confirmed, and sends the rest at once", () => {
    const [delivery] = posted(3);
    answerAt(delivery, answered(422, { detail: [{ loc: ["body", "events", 1, "name"], msg: "bad" }] }), 1, 5);
    const report = effectAt(delivery, 1);
    assert.deepEqual(report.kind === "ReportDropped" && report.events, [{ name: "a", external_id: "e2" }]);
    answerAt(delivery, { kind: "Reported" }, 1, 5);
    const confirm = effectAt(delivery, 1);
    assert.equal(confirm.kind === "SettleScript" && confirm.script, "confirm");
    answerAt(delivery, { kind: "Settled", reply: null }, 1, 5);
    assert.equal(effectAt(delivery, 1).kind, "RefreshClaim");
    answerAt(delivery, { kind: "Done" }, 1, 5);
    assert.deepEqual(ids(effectAt(delivery, 1)), ["e1", "e3"]);
  });

  it("bisects a batch a 400 refuses without saying which event", () => {
    const [delivery] = posted(4);
    answerAt(delivery, answered(400), 1, 0);
    assert.equal(effectAt(delivery, 1).kind, "RefreshClaim");
    answerAt(delivery, { kind: "Done" }, 1, 0);
    assert.deepEqual(ids(effectAt(delivery, 1)), ["e1", "e2"]);
  });

  it("waits without using an attempt when Polar cannot take the batch, and honours Retry-After", () => {
    const [delivery] = posted(1, { maxAttempts: 1 });
    answerAt(delivery, answered(429, "", 30), 1, 0);
    assert.deepEqual(effectAt(delivery, 1), { kind: "Sleep", until: 31 });
    answerAt(delivery, { kind: "Done" }, 31, 0);
    assert.equal(delivery.rateLimited, 1);
    assert.equal(effectAt(delivery, 31).kind, "RefreshClaim");
    answerAt(delivery, { kind: "Done" }, 31, 0);
    assert.equal(effectAt(delivery, 31).kind, "PostBatch");
    answerAt(delivery, answered(422, { detail: [{ loc: ["body", "events", 0, "timestamp"], msg: "must be in the past" }] }), 32, 0);
    assert.match(delivery.stalled ?? "", /clock is ahead/);
    assert.equal(delivery.blocked, false); // it passes by itself: a flush may still succeed
    assert.equal(effectAt(delivery, 32).kind, "Sleep");
  });

  it("retries a 500 and, after max attempts, reports and acknowledges (Polar may hold them)", () => {
    const [delivery] = posted(1, { maxAttempts: 2 });
    answerAt(delivery, answered(500), 1, 0);
    assert.deepEqual(effectAt(delivery, 1), { kind: "Sleep", until: 1.75 });
    answerAt(delivery, { kind: "Done" }, 2, 0);
    effectAt(delivery, 2);
    answerAt(delivery, { kind: "Done" }, 2, 0);
    effectAt(delivery, 2);
    answerAt(delivery, { kind: "BatchFailed", reason: "reset", maybeSent: true }, 3, 0);
    const report = effectAt(delivery, 3);
    assert.equal(report.kind === "ReportDropped" && report.reason, "reset, after 2 attempts");
    answerAt(delivery, { kind: "Reported" }, 3, 0);
    const settle = effectAt(delivery, 3);
    assert.equal(settle.kind === "SettleScript" && settle.script, "acknowledge");
  });

  it("stalls on a token or URL mistake, and removes unreadable outbox entries", () => {
    const [delivery] = posted(1);
    assert.equal(delivery.blocked, false);
    answerAt(delivery, answered(401), 1, 0);
    assert.match(delivery.stalled ?? "", /401/);
    assert.ok(delivery.blocked, "only an operator ends it: a flush would only wait");
    assert.deepEqual(delivery.reports(), [
      { level: "error", message: "outpost delivery is stalled: Polar answered 401: check the access token and server URL" },
    ]);
    assert.deepEqual(delivery.reports(), []);
    assert.deepEqual(effectAt(delivery, 1), { kind: "Sleep", until: 31 });
    answerAt(delivery, { kind: "Done" }, 31, 0);
    const fresh = new Delivery(makeDeliverySettings(), { random: () => 0 }, 0);
    effectAt(fresh, 0);
    answerAt(fresh, { kind: "OutboxRead", entries: [[STREAM, "9-0", new Map([["e", "not json"]])], ["elsewhere", "1-0", {}]] }, 0, 0);
    assert.equal(fresh.rejectedEntries, 2);
    assert.deepEqual(fresh.reports(), [{ level: "warning", message: "outpost removed 2 unreadable outbox entries (or rejected replies)" }]);
    const confirm = effectAt(fresh, 0);
    assert.deepEqual(confirm.kind === "SettleScript" && confirm.args.slice(3), ["1", "9-0"]);
  });

  it("refuses an outcome that answers no action", () => {
    const delivery = new Delivery(makeDeliverySettings(), { random: () => 0 }, 0);
    assert.throws(() => answerAt(delivery, { kind: "Done" }, 0, 0), UsageError);
    effectAt(delivery, 0);
    assert.throws(() => effectAt(delivery, 0), UsageError);
    assert.throws(() => answerAt(delivery, { kind: "Reported" }, 0, 0), UsageError);
    assert.throws(() => makeDeliverySettings({ batchSize: 0 }), UsageError);
  });

  it("refuses settings no loop could use, with Python's words", () => {
    const refused: [Partial<DeliverySettings>, string][] = [
      [{ batchSize: NaN }, "batch_size must be an integer, at least 1, got nan"],
      [{ batchSize: 2.5 }, "batch_size must be an integer, at least 1, got 2.5"],
      [{ maxAttempts: Infinity }, "max_attempts must be an integer, at least 1, got inf"],
      [{ batchBytes: 1023 }, "batch_bytes must be an integer, at least 1024, got 1023"],
      [{ settleEvery: -1 }, "settle_every must be an integer, not negative (0: each batch settles alone), got -1"],
      [{ heartbeat: Infinity }, "heartbeat must be a positive, finite number, got inf"],
      [{ heartbeat: 0 }, "heartbeat must be a positive, finite number, got 0"],
      [{ requestsPerMinute: NaN }, "requests_per_minute must be a finite number, not negative (0: no budget), got nan"],
      [{ linger: NaN }, "linger must be a finite number, not negative, got nan"],
      [{ backoffCap: Infinity }, "backoff_cap must be a finite number, not negative, got inf"],
      [{ stallDelay: -1 }, "stall_delay must be a finite number, not negative, got -1"],
      [{ claimInterval: NaN }, "claim_interval must be a finite number, not negative, got nan"],
      [{ flushBlock: -Infinity }, "flush_block must be a finite number, not negative, got -inf"],
    ];
    for (const [settings, message] of refused) {
      assert.throws(() => makeDeliverySettings(settings), (exc: unknown) => exc instanceof UsageError && exc.message === message, message);
    }
  });

  it("reads Retry-After as seconds or an HTTP date, capped at two minutes", () => {
    assert.equal(retryAfter(null, 0), null);
    assert.equal(retryAfter(" 7 ", 0), 7);
    assert.equal(retryAfter("999", 0), 120);
    assert.equal(retryAfter("Thu, 01 Jan 1970 00:00:10 GMT", 4_000_000), 6);
    assert.equal(retryAfter("soon", 0), null);
  });
});
