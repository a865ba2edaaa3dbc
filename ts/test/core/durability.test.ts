/** What the durability setting asks Redis for, and what WAIT's answer means (core/durability.ts;
 * the Python core's tests/core/test_durability.py, the same cases and messages). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Durability } from "../../src/core/durability.js";
import { NotDurable, RedisUnavailable, UsageError } from "../../src/core/errors.js";

describe("the durability setting", () => {
  it("sends no WAIT for primary, and WAIT 1 <ms> for replica", () => {
    assert.equal(Durability.of("primary", 1.0).wait(), null);
    assert.deepEqual(Durability.of("replica", 0.25).wait(), ["WAIT", 1, 250]);
    assert.deepEqual(Durability.of("replica", 0.0001).wait(), ["WAIT", 1, 1]); // WAIT's 0 is for ever
    // Milliseconds rounded as Python's round() does: half to even.
    assert.deepEqual(Durability.of("replica", 0.0025).wait(), ["WAIT", 1, 2]);
    assert.deepEqual(Durability.of("replica", 0.0035).wait(), ["WAIT", 1, 4]);
  });

  it("is satisfied by a replica that acknowledged", () => {
    const replica = Durability.of("replica", 1.0);
    assert.equal(replica.shortfall(1), null);
    assert.equal(replica.shortfall(2), null);
    assert.equal(replica.shortfall(0), "0 of 1 replica(s) acknowledged the event within 1000 ms");
  });

  it("takes an answer that is not a count for a shortfall", () => {
    const replica = Durability.of("replica", 1.0);
    assert.equal(replica.shortfall("OK"), "WAIT answered 'OK' instead of a count of replicas");
    assert.equal(replica.shortfall(true), "WAIT answered True instead of a count of replicas");
    assert.equal(replica.shortfall(null), "WAIT answered None instead of a count of replicas");
    assert.equal(replica.shortfall(0.5), "WAIT answered 0.5 instead of a count of replicas");
  });

  it("refuses a wrong setting at once, in Python's words", () => {
    for (const [name, timeout, said] of [
      ["replicas", 1.0, "durability must be 'primary' or 'replica', got 'replicas'"],
      ["", 1.0, "durability must be 'primary' or 'replica', got ''"],
      [undefined, 1.0, "durability must be 'primary' or 'replica', got None"],
      ["replica", 0, "durability_timeout must be a positive number, got 0"],
      ["replica", -1.5, "durability_timeout must be a positive number, got -1.5"],
      ["replica", true, "durability_timeout must be a positive number, got True"],
      ["replica", "1", "durability_timeout must be a positive number, got '1'"],
      ["replica", Number.NaN, "durability_timeout must be a positive number, got nan"],
      ["replica", Number.POSITIVE_INFINITY, "durability_timeout must be a positive number, got inf"],
    ] as const) {
      assert.throws(() => Durability.of(name as unknown as string, timeout as unknown as number), (exc: unknown) => exc instanceof UsageError && exc.message === said, `${String(name)} ${String(timeout)}`);
    }
  });

  it("raises NotDurable as a RedisUnavailable carrying the event's id (null for a hold)", () => {
    const error = new NotDurable("event e1 is on the primary only: ...", "e1");
    assert.ok(error instanceof RedisUnavailable);
    assert.equal(error.eventId, "e1");
    assert.equal(error.name, "NotDurable");
    assert.equal(new NotDurable("reserve is on the primary only: ...").eventId, null);
  });
});
