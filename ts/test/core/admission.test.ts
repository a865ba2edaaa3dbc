/** Exact admission in the core, without I/O: the scripts' calls are the Python core's, byte for
 * byte (the same inputs give the KEYS and ARGV outpost_core.admission gives), refusals are read,
 * and reads count the holds that have not expired. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { admit, refusalOf, release, reserve } from "../../src/core/admission.js";
import { InsufficientBalance, UnknownMeter, UnsupportedMeter, UsageError } from "../../src/core/errors.js";
import { deriveState } from "../../src/core/mirror.js";
import { heldAt, holdExpiry } from "../../src/core/balance.js";
import { Session } from "../../src/core/session.js";

const ANY = { conjunction: "and", clauses: [] };
const CONFIGURATION = {
  organization_id: "org",
  reducers: [
    { id: "r-count", filter: ANY, aggregation: { func: "count" }, meter_ids: ["m-count"] },
    { id: "r-tokens", filter: ANY, aggregation: { func: "sum", property: "tokens" }, meter_ids: ["m-tokens"] },
    { id: "r-largest", filter: ANY, aggregation: { func: "max", property: "tokens" }, meter_ids: ["m-largest"] },
  ],
};
const ST = "outpost:v2:{10}:external:c1";

function configured(reducers = CONFIGURATION.reducers): Session {
  const session = new Session();
  session.handle({ kind: "ConfigurationReceived", payload: { ...CONFIGURATION, reducers }, fromCache: false });
  return session;
}

describe("admission", () => {
  it("reserves and releases with the Python core's KEYS and ARGV", () => {
    const session = configured();
    const [run, hold] = reserve(session, "m-tokens", 2.5, "c1", null, { ttl: 1.5, nowUs: 1_000_000, holdId: "h1" });
    assert.deepEqual(run.keys, [`${ST}:r-tokens`]);
    assert.deepEqual(run.args, ["outpost:v2:{10}:changes", "1000000", "h:h1", "2.5", "2500000", "sum", "c:m-tokens", "-1"]);
    const released = release(session, hold, 2_000_000);
    assert.deepEqual(released.args, ["outpost:v2:{10}:changes", "2000000", "h:h1", "-1"]);
    assert.throws(() => reserve(session, "m-largest", 1, "c1", null, { ttl: 1, nowUs: 0, holdId: "h" }), UnsupportedMeter);
    assert.throws(() => reserve(session, "m-nope", 1, "c1", null, { ttl: 1, nowUs: 0, holdId: "h" }), UnknownMeter);
    assert.throws(() => reserve(session, "m-count", 0, "c1", null, { ttl: 1, nowUs: 0, holdId: "h" }), UsageError);
    assert.throws(() => reserve(session, "m-count", 1, "c1", null, { ttl: 0, nowUs: 0, holdId: "h" }), UsageError);
  });

  it("admits a commit with checks as the Python core does", () => {
    const session = configured(CONFIGURATION.reducers.slice(0, 2));
    const [, hold] = reserve(session, "m-tokens", 2.5, "c1", null, { ttl: 1.5, nowUs: 1_000_000, holdId: "h1" });
    const track = session.track({ name: "a", externalCustomerId: "c1", metadata: { tokens: 3 }, timestampUs: 300_000_001, nowUs: 300_000_001, eventId: "e1" });
    const [run, asks] = admit(session, track, hold.customer, { nowUs: 5, requireBalance: true, hold });
    assert.deepEqual(run.keys, track.keys);
    assert.deepEqual(run.args.slice(5), ["5", "2", "h:h1", "4", "-1", "-1", "1", "count", "1", "c:m-count", "0", "-1", "3", "sum", "1", "c:m-tokens", "0"]);
    assert.deepEqual([...asks], [["m-count", 1], ["m-tokens", 3]]);
    const all = configured();
    const wide = all.track({ name: "a", externalCustomerId: "c1", metadata: { tokens: 3 }, timestampUs: 1, nowUs: 1, eventId: "e2" });
    assert.throws(() => admit(all, wide, hold.customer, { nowUs: 5, requireBalance: true }), UnsupportedMeter);
    const [plain] = admit(all, wide, hold.customer, { nowUs: 5 });
    assert.equal(plain.args[6], "3");
  });

  it("reads refusals, and nothing else, from the scripts' replies", () => {
    const refusal = refusalOf('{"no":["m","10","4.5"]}');
    assert.ok(refusal !== null);
    const error = refusal.error(7);
    assert.ok(error instanceof InsufficientBalance);
    assert.deepEqual([error.units, error.balance, error.held, error.available], [7, 10, 4.5, 5.5]);
    for (const reply of ['{"c":[]}', '{"dup":1}', null, '{"no":[1,"1","1"]}', '{"no":["m","x","1"]}', '{"no":', '{"no":["m","1"]}']) {
      assert.equal(refusalOf(reply), null, String(reply));
    }
    assert.ok(refusalOf(Buffer.from('{"no":["m","1","0"]}')) !== null);
  });

  it("counts the holds that have not expired", () => {
    const state = deriveState(new Map([["rev", "1"], ["h:a", "3 10"], ["h:b", "2 5"], ["h:c", "x"], ["h:d", "1"]]));
    assert.deepEqual(state.holds, [[3, 10], [2, 5]]);
    assert.deepEqual(state.problems, ["h:c='x'", "h:d='1'"]);
    assert.deepEqual([heldAt(state, 4), heldAt(state, 5), heldAt(state, 10)], [5, 3, 0]);
    assert.deepEqual([holdExpiry(state, 0), holdExpiry(state, 5), holdExpiry(state, 10)], [5, 10, null]);
  });
});
