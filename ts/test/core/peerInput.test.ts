/** What a peer writes is counted when unreadable, never trusted as a number: nested brackets and
 * integers of thousands of digits (the Python core refuses them the same way). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Aggregate } from "../../src/core/aggregate.js";
import { Malformed, parseChanges } from "../../src/core/changes.js";
import { deriveState, MAX_US, parseInt10 } from "../../src/core/mirror.js";

const DIGITS = "9".repeat(5000);

describe("peer input", () => {
  it("reads at most 20 digits as an integer", () => {
    assert.equal(parseInt10("-12"), -12);
    assert.equal(parseInt10("9".repeat(20)), Number("9".repeat(20)));
    assert.equal(parseInt10("9".repeat(21)), null);
    assert.equal(parseInt10(DIGITS), null);
    assert.equal(Aggregate.decode(`${DIGITS} 1 1 1`), null);
  });

  it("counts a state hash of absurd numbers as problems", () => {
    const state = deriveState(new Map([["n", DIGITS], ["cu", String(MAX_US + 1000)], ["rev", DIGITS]]));
    assert.equal(state.problems.length, 3);
    assert.equal(state.coldUntil, null);
    assert.equal(state.pending, 0);
  });

  it("refuses nested brackets as a malformed change", () => {
    assert.throws(() => parseChanges("[".repeat(100_000)), Malformed);
  });
});
