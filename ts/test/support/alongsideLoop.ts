/** A delivery machine driven as a loop does, past its first claim, at time `now` (advanced by the
 * test): the core tests of settling alongside posts and of settling batches together. */

import assert from "node:assert/strict";
import { Delivery, type DeliveryEffect, type DeliveryInput, type DeliverySettings, makeDeliverySettings } from "../../src/core/delivery.js";

export class AlongsideLoop {
  now = 0;
  readonly delivery: Delivery;
  constructor(overrides: Partial<DeliverySettings> = {}) {
    this.delivery = new Delivery(makeDeliverySettings({ linger: 0, settleAlongside: true, ...overrides }), { random: () => 0.5 }, 0);
    assert.equal(this.next().kind, "ClaimStale");
    this.delivery.handle({ kind: "OutboxRead", entries: [] }, 0, 0);
  }
  next(): DeliveryEffect {
    return this.delivery.nextEffect(this.now);
  }
  /** Report `input` for the action outstanding, and say what comes next. */
  step(input: DeliveryInput): DeliveryEffect {
    this.delivery.handle(input, this.now, 1);
    return this.next();
  }
}
