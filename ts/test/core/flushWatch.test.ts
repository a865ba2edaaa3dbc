/** What a flush waits for, and when it reads the outboxes to see. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { FlushWatch, LOOK, lastEntries } from "../../src/core/flushWatch.js";

const A = "outpost:v2:{0}:outbox";
const B = "outpost:v2:{1}:outbox";

describe("flush watch", () => {
  it("the marks are each stream's last entry, and a peer's reply gives none", () => {
    const replies = [[[Buffer.from("5-0"), [Buffer.from("e"), Buffer.from("{}")]]], []];
    assert.deepEqual(lastEntries([A, B], replies), new Map([[A, Buffer.from("5-0")]]));
    assert.deepEqual(lastEntries([A], [[["7-1", []]]]), new Map([[A, "7-1"]]));
    for (const odd of [null, Buffer.from("x"), [null], [[]], [[5, []]], [Buffer.from("5-0")]]) {
      assert.deepEqual(lastEntries([A], [odd]), new Map(), String(odd));
    }
  });

  it("nothing queued is done at once", () => {
    assert.ok(new FlushWatch(new Map(), 0, 1).done);
  });

  it("is done once every stream holds nothing up to its mark", () => {
    const watch = new FlushWatch(new Map([[A, "5-0"], [B, "9-0"]]), 0, 1);
    assert.ok(watch.lookNow(0, { settling: false, holdingNothing: false })); // the first look: at once
    assert.equal(watch.looked(new Map([[A, false], [B, true]])), false);
    assert.deepEqual(watch.marks, new Map([[B, "9-0"]])); // the next look reads B only
    assert.ok(watch.looked(new Map([[B, false]])) && watch.done);
  });

  it("looks when the loops hold nothing, or every look interval", () => {
    const watch = new FlushWatch(new Map([[A, "5-0"]]), 0, 1);
    assert.ok(watch.lookNow(0, { settling: false, holdingNothing: false }));
    assert.ok(!watch.lookNow(0.01, { settling: false, holdingNothing: false })); // a backlog's batch
    assert.ok(watch.lookNow(0.02, { settling: false, holdingNothing: true })); // the last settled
    assert.ok(!watch.lookNow(0.02 + LOOK / 2, { settling: false, holdingNothing: false }));
    assert.ok(watch.lookNow(0.02 + LOOK, { settling: false, holdingNothing: false })); // others settle
  });

  it("never looks while a settle runs", () => {
    const watch = new FlushWatch(new Map([[A, "5-0"]]), 0, 1);
    assert.ok(!watch.lookNow(5, { settling: true, holdingNothing: true }));
    assert.ok(watch.lookNow(5, { settling: false, holdingNothing: true }));
  });

  it("waits a look interval at most, and times out", () => {
    const watch = new FlushWatch(new Map([[A, "5-0"]]), 10, 1);
    assert.equal(watch.wait(10), LOOK);
    const almost = watch.wait(10.99);
    assert.ok(almost !== null && almost < LOOK);
    assert.equal(watch.wait(11), null);
  });
});
