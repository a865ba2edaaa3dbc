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

  it("leaves a change of keys not followed unparsed, and parses one with a followed key", () => {
    const followed = (key: string): boolean => key === "mine" || key === "a/b";
    // Broken after its keys: parsing it would throw, but none of its keys is followed.
    const truncated = '{"c":[{"k":"theirs","r":1},{"k": "other","r":2';
    assert.deepEqual(parseChanges(truncated, followed), []);
    assert.throws(() => parseChanges(truncated), Malformed);
    const both = '{"c":[{"k":"theirs","r":1,"s":[]},{"k":"mine","r":2,"s":["u","1"]}]}';
    assert.deepEqual(parseChanges(both, followed)?.map((c) => [c.key, c.rev]), [["mine", 2]]);
    // A key written with an escape (cjson writes "/" as "\/") is left to the parse.
    assert.deepEqual(parseChanges('{"c":[{"k":"a\\/b","r":3}]}', followed)?.map((c) => c.key), ["a/b"]);
    assert.equal(parseChanges('{"dup":1}', followed), null);
  });

  it("refuses nested brackets as a malformed change", () => {
    assert.throws(() => parseChanges("[".repeat(100_000)), Malformed);
  });
});
