/** A delivery machine driven as a loop does, past its first claim, at time `now` (advanced by the
 * test), and the entries, answers and checks of what it posts: the core tests of settling
 * alongside posts and of settling batches together. */

import assert from "node:assert/strict";
import { Delivery, type DeliveryEffect, type DeliveryInput, type DeliverySettings, makeDeliverySettings } from "../../src/core/delivery.js";
import { answerAt, effectAt } from "./deliveryLoop.js";

export const STREAM = "outpost:v2:{3}:outbox";

/** An outbox entry of `stream` whose event's external id is `name` (its entry id from `name` too). */
export const entry = (name: string, stream = STREAM): [string, string, Map<string, string>] => [
  stream,
  `${name.charCodeAt(0)}-0`,
  new Map([
    ["e", JSON.stringify({ name: "a", external_id: name })],
    ["f", `0:${name}`],
    ["k", JSON.stringify(["outpost:v2:{3}:external:x:r"])],
  ]),
];
export const read = (...names: string[]): DeliveryInput => ({ kind: "OutboxRead", entries: names.map((n) => entry(n)) });
export const answer = (status: number): DeliveryInput => ({ kind: "BatchAnswered", status, body: new Uint8Array(), retryAfter: null });
export const ok = answer(200);
export const SETTLED: DeliveryInput = { kind: "Settled", reply: null };

/** The external ids a post (or the post a PostAndSettle carries) sends. */
export function posted(action: DeliveryEffect): string[] {
  const post = action.kind === "PostAndSettle" ? action.post : action;
  assert.equal(post.kind, "PostBatch");
  return (JSON.parse(new TextDecoder().decode(post.kind === "PostBatch" ? post.body : new Uint8Array())).events as { external_id: string }[]).map((e) => e.external_id);
}

export class AlongsideLoop {
  now = 0;
  readonly delivery: Delivery;
  constructor(overrides: Partial<DeliverySettings> = {}) {
    this.delivery = new Delivery(makeDeliverySettings({ linger: 0, settleAlongside: true, ...overrides }), { random: () => 0.5 }, 0);
    assert.equal(this.next().kind, "ClaimStale");
    answerAt(this.delivery, { kind: "OutboxRead", entries: [] }, 0, 0);
  }
  next(): DeliveryEffect {
    return effectAt(this.delivery, this.now);
  }
  /** Report `input` for the action outstanding, and say what comes next. */
  step(input: DeliveryInput): DeliveryEffect {
    answerAt(this.delivery, input, this.now, 1);
    return this.next();
  }
}
