/** Recognising this instance's own changes when they come back over pub/sub: the bookkeeping
 * (Echoes), then the rule the session keeps with it (scriptSent, ownEcho, and the tickets its
 * inputs carry), as tests/core/test_echoes.py. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { Balance } from "../../src/core/balance.js";
import { Echoes } from "../../src/core/echoes.js";
import { UsageError } from "../../src/core/errors.js";
import { Session } from "../../src/core/session.js";
import { type Record_, header, recordSession, replaySession } from "../../src/core/trace.js";
import { PythonRandom } from "../../src/core/random.js";

const CONFIGURATION = {
  organization_id: "org",
  reducers: [{ id: "r-count", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "count" }, meter_ids: ["m-count"] }],
};
const KEY = "outpost:v2:{10}:external:c1:r-count";

/** A session that follows c1's count copy at revision 3. */
function followed(session = new Session()): Session {
  session.handle({ kind: "ConfigurationReceived", payload: CONFIGURATION, fromCache: true });
  session.handle({ kind: "SubscriberRestarted" });
  assert.equal(session.read("m-count", "c1"), null);
  const [load] = session.effects();
  assert.equal(load?.kind, "LoadIdentity");
  session.handle({ kind: "IdentityLoaded", key: KEY, fields: { rev: "3", cu: "0", p: "0 0 - -", "c:m-count": "10", n: "0", u: "0" }, loadId: 1 });
  assert.equal(session.effects().length, 0);
  return session;
}

const change = (rev: number): string => JSON.stringify({ c: [{ k: KEY, r: rev, s: ["n", "0"], d: [] }] });

/** A reply with the whole state: the script's caller did not hold the previous revision. */
const full = (rev: number): string => JSON.stringify({ c: [{ k: KEY, r: rev, s: ["rev", String(rev), "cu", "0", "p", "0 0 - -", "n", "0", "u", "0"], full: 1 }] });

function revision(session: Session): number {
  return (session.read("m-count", "c1") as Balance).revision;
}

describe("echoes", () => {
  it("recognises an expected echo once, and forgets those that never come", () => {
    const echoes = new Echoes(2);
    echoes.expect("a");
    assert.equal(echoes.seen("b"), false);
    assert.equal(echoes.seen("a"), true);
    assert.equal(echoes.seen("a"), false);
    echoes.expect(null);
    for (const reply of ["r0", "r1", "r2"]) echoes.expect(reply);
    assert.equal(echoes.length, 2);
    assert.equal(echoes.seen("r0"), false);
    assert.equal(echoes.seen(new TextEncoder().encode("r1")), false); // bytes are not the text
  });

  it("holds a message only while a script is in flight, for the scripts that could have published it", () => {
    const echoes = new Echoes();
    assert.equal(echoes.hold("foreign"), false);
    const first = echoes.sent();
    const second = echoes.sent();
    assert.ok(echoes.holding);
    assert.ok(echoes.hold("second's"));
    const third = echoes.sent();
    assert.ok(echoes.hold("foreign"));
    assert.deepEqual(echoes.replied(first, "first's"), []);
    assert.deepEqual(echoes.replied(second, ["second's", "whole states"]), []); // its echo, dropped
    assert.deepEqual(echoes.replied(third, null), ["foreign"]);
    assert.ok(echoes.seen("first's"));
    assert.equal(echoes.holding, false);
    assert.throws(() => echoes.replied(third, null), UsageError);
  });
});

describe("the session's echo rule", () => {
  it("holds an echo come before its reply, and drops it unparsed by that reply", () => {
    const session = followed();
    const ticket = session.scriptSent();
    const published = "what the script published"; // not a change: parsed, it would be rejected
    session.handle({ kind: "ChangePublished", data: published });
    assert.ok(session.holding);
    session.handle({ kind: "ScriptReplied", reply: [published, change(4)], tag: null, ticket });
    assert.equal(revision(session), 4);
    assert.equal(session.rejections.size, 0);
    assert.equal(session.holding, false);
    assert.equal(session.ownEcho(published), false); // taken by its reply: not expected again
  });

  it("expects the echo of a reply that came first", () => {
    const session = followed();
    const ticket = session.scriptSent();
    session.handle({ kind: "ScriptReplied", reply: change(4), tag: null, ticket });
    assert.ok(session.ownEcho(change(4)));
    assert.equal(session.ownEcho(change(4)), false);
  });

  it("applies another instance's change held meanwhile before the reply", () => {
    const session = followed();
    assert.equal(revision(session), 3);
    const ticket = session.scriptSent();
    session.handle({ kind: "ChangePublished", data: change(4) });
    assert.notEqual(session.cachedBalance("m-count", "c1", null), null); // held: nothing applied yet
    session.handle({ kind: "ScriptReplied", reply: change(5), tag: null, ticket });
    assert.deepEqual(session.effects(), []); // 4, then 5: no gap, no reload
    assert.equal(revision(session), 5);
  });

  it("keeps a held change for every script that could have published it", () => {
    const session = followed();
    const first = session.scriptSent();
    const second = session.scriptSent();
    const published = "the second's change";
    session.handle({ kind: "ChangePublished", data: published });
    session.handle({ kind: "ScriptReplied", reply: ["the first's change", full(5)], tag: null, ticket: first });
    assert.ok(session.holding);
    session.handle({ kind: "ScriptReplied", reply: [published, full(6)], tag: null, ticket: second });
    assert.equal(session.rejections.size, 0);
    assert.equal(revision(session), 6);
  });

  it("does not hold a released change again for a script sent after it came", () => {
    const session = followed();
    const first = session.scriptSent();
    session.handle({ kind: "ChangePublished", data: change(4) });
    const later = session.scriptSent();
    session.handle({ kind: "ScriptReplied", reply: change(5), tag: null, ticket: first });
    assert.deepEqual(session.effects(), []);
    assert.equal(revision(session), 5);
    session.handle({ kind: "ScriptFailed", tag: null, ticket: later });
    assert.equal(session.holding, false);
  });

  it("releases what was held when a script fails or writes nothing", () => {
    const session = followed();
    let ticket = session.scriptSent();
    session.handle({ kind: "ChangePublished", data: change(4) });
    session.handle({ kind: "ScriptFailed", tag: null, ticket });
    assert.equal(revision(session), 4);
    ticket = session.scriptSent();
    session.handle({ kind: "ChangePublished", data: change(5) });
    session.handle({ kind: "ScriptReplied", reply: null, tag: null, ticket }); // an admission refused
    assert.equal(revision(session), 5);
    assert.equal(session.rejections.size, 0);
    session.handle({ kind: "ChangePublished", data: change(6) }); // nothing in flight: at once
    assert.equal(revision(session), 6);
  });

  it("expects a loop's reply without a ticket, and refuses a ticket that ended", () => {
    const session = followed();
    const ticket = session.scriptSent();
    session.handle({ kind: "ScriptReplied", reply: change(4), tag: null }); // a settle: not held
    assert.equal(revision(session), 4);
    assert.ok(session.ownEcho(change(4)));
    session.handle({ kind: "ScriptFailed", tag: null, ticket });
    assert.throws(() => session.handle({ kind: "ScriptFailed", tag: null, ticket }), UsageError);
    assert.throws(() => session.handle({ kind: "ScriptReplied", reply: change(5), tag: null, ticket: 7 }), UsageError);
  });

  it("records the tickets it gives, and a recorded run with held changes replays the same", () => {
    const records: Record_[] = [header("session", "Settings", new Session().settings, 0, {})];
    const session = followed(recordSession(new Session(), (record) => records.push(record)));
    const first = session.scriptSent();
    session.handle({ kind: "ChangePublished", data: change(4) });
    assert.equal(session.ownEcho("nothing expected"), false); // asked without a record
    session.handle({ kind: "ScriptReplied", reply: change(5), tag: null, ticket: first });
    const second = session.scriptSent();
    session.handle({ kind: "ChangePublished", data: change(6) });
    session.handle({ kind: "ScriptFailed", tag: null, ticket: second });
    assert.equal(revision(session), 6);
    assert.deepEqual(
      records.filter((r) => r.method === "script_sent").map((r) => r.result),
      [0, 1],
    );
    assert.deepEqual(replaySession(JSON.parse(JSON.stringify(records)) as Record_[], (seed) => new PythonRandom(seed)), []);
  });
});
