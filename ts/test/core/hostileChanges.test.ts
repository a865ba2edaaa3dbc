/** Changes on a shard channel that are not what the scripts publish (any client of the Redis can
 * publish there): counted as rejections, never taken into a copy (as the Python core does). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { Balance } from "../../src/core/balance.js";
import { Malformed, parseChanges } from "../../src/core/changes.js";
import { deriveState } from "../../src/core/mirror.js";
import { Session } from "../../src/core/session.js";

const CONFIGURATION = {
  reducers: [{ id: "r-count", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "count" }, meter_ids: ["m-count"] }],
};
const KEY = "outpost:v2:{10}:external:c1:r-count";
const FIELDS = { rev: "3", cu: "300000000", sa: "299999999", sid: "s-1", p: "2 5 1 4", "c:m-count": "10", n: "0", u: "0" };

/** A subscribed session whose copy of c1 is loaded at revision 3; its balance from memory. */
function warm(): { session: Session; before: Balance } {
  const session = new Session();
  session.handle({ kind: "ConfigurationReceived", payload: CONFIGURATION, fromCache: false });
  session.handle({ kind: "SubscriberRestarted" });
  assert.equal(session.read("m-count", "c1"), null);
  session.effects();
  session.handle({ kind: "IdentityLoaded", key: KEY, fields: FIELDS, loadId: 1 });
  const before = session.read("m-count", "c1") as Balance;
  assert.equal(before.source, "memory");
  assert.equal(before.balance, 8);
  return { session, before };
}

const published = (change: Record<string, unknown>): string => JSON.stringify({ c: [{ k: KEY, ...change }] });

describe("a hostile change", () => {
  it("refuses a full other than 1, and takes 1 (1.0 in JSON) as the whole state", () => {
    for (const full of ["true", "0", '"1"', "null"]) {
      assert.throws(() => parseChanges(`{"c":[{"k":"s","r":1,"s":[],"full":${full}}]}`), (e) => e instanceof Malformed && e.message === "'full' is not 1");
    }
    for (const full of ["1", "1.0"]) assert.equal(parseChanges(`{"c":[{"k":"s","r":1,"s":[],"full":${full}}]}`)?.[0]?.full, true);
    assert.equal(parseChanges('{"c":[{"k":"s","r":1,"s":[]}]}')?.[0]?.full, false);
  });

  it("counts a change whose full is true and does not take it", () => {
    const { session, before } = warm();
    session.handle({ kind: "ChangePublished", data: published({ r: 4, s: ["rev", "4", "p", "0 0 - -"], full: true }) });
    assert.deepEqual([...session.rejections], [["change", 1]]);
    assert.deepEqual(session.read("m-count", "c1"), before);
  });

  it("refuses deleted fields that are null", () => {
    assert.throws(() => parseChanges('{"c":[{"k":"s","r":1,"s":[],"d":null}]}'), (e) => e instanceof Malformed && e.message === "'d' is not a list");
    const { session, before } = warm();
    session.handle({ kind: "ChangePublished", data: published({ r: 4, s: ["p", "0 0 - -"], d: null }) });
    assert.deepEqual([...session.rejections], [["change", 1]]);
    assert.deepEqual(session.read("m-count", "c1"), before);
  });

  // Values the scripts never write, each in a field a read uses (the copy holds 10 credited, 2
  // consumed: a balance of 8).
  const UNREADABLE = [
    ["a:123", "x y z"],
    ["c:m-count", "NaN"],
    ["p", "1 2"],
    ["cu", "-1"],
    ["h:x", "garbage"],
    ["rev", "-4"],
  ];

  it("counts a change holding an unreadable value, and the hash decides", () => {
    for (const [name, value] of UNREADABLE) {
      const { session, before } = warm();
      session.handle({ kind: "ChangePublished", data: published({ r: 4, s: [name, value, "n", "0"] }) });
      assert.deepEqual([...session.rejections], [["change", 1]], name);
      // Not taken: the copy reloads the hash (here, as it was: a peer published the change).
      assert.deepEqual(session.effects(), [{ kind: "LoadIdentity", key: KEY, loadId: 2 }]);
      assert.equal(session.read("m-count", "c1"), null);
      session.handle({ kind: "IdentityLoaded", key: KEY, fields: FIELDS, loadId: 2 });
      assert.deepEqual(session.read("m-count", "c1"), before);
      assert.deepEqual([...session.rejections], [["change", 1]]);
    }
  });

  it("never lifts the balance above the hash's with an unreadable Polar aggregate", () => {
    const { session } = warm();
    session.handle({ kind: "ChangePublished", data: published({ r: 4, s: ["p", "1 2"] }) });
    // Taken, "p" read as absent, the copy forgot Polar's 2 consumed units: a balance of 10.
    assert.equal(session.read("m-count", "c1"), null); // the copy reloads instead
    session.handle({ kind: "IdentityLoaded", key: KEY, fields: { ...FIELDS, rev: "4" }, loadId: 2 });
    const after = session.read("m-count", "c1") as Balance;
    assert.deepEqual([after.balance, after.revision], [8, 4]);
  });

  it("counts an old change holding an unreadable value and reloads nothing", () => {
    const { session, before } = warm();
    session.handle({ kind: "ChangePublished", data: published({ r: 3, s: ["p", "1 2"] }) });
    assert.deepEqual([...session.rejections], [["change", 1]]);
    assert.deepEqual(session.effects(), []);
    assert.deepEqual(session.read("m-count", "c1"), before);
  });

  it("counts a time before 1970 in a state hash, read as absent", () => {
    const state = deriveState(new Map([["cu", "-1"], ["sa", "-5"], ["n", "-2"], ["u", "-3"]]));
    assert.deepEqual([state.coldUntil, state.asOf, state.pending, state.undelivered], [null, null, 0, 0]);
    assert.deepEqual(state.problems, ["cu='-1'", "sa='-5'"]);
  });
});
