/** The session without I/O: configuration, copies, reads and the rejections of bad peer input. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { InvalidEvent, NotReady, UnknownMeter, UnsupportedMeter, UsageError } from "../../src/core/errors.js";
import { Session, makeSettings } from "../../src/core/session.js";
import { Link, Target } from "../../src/core/link.js";
import { PythonRandom } from "../../src/core/random.js";
import type { Balance } from "../../src/core/balance.js";

const CONFIGURATION = {
  organization_id: "org",
  reducers: [
    { id: "r-count", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "count" }, meter_ids: ["m-count"] },
    { id: "r-unique", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "unique", property: "user" }, meter_ids: ["m-unique"] },
    { id: "r-tokens", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "sum", property: "tokens" }, meter_ids: ["m-tokens"] },
    { id: "bad", filter: { conjunction: "xor", clauses: [] }, aggregation: { func: "count" }, meter_ids: ["m-bad"] },
  ],
};
const KEY = "outpost:v2:{10}:external:c1:r-count";

function configured(): Session {
  const session = new Session();
  session.handle({ kind: "ConfigurationReceived", payload: CONFIGURATION, fromCache: false });
  return session;
}

describe("the session", () => {
  it("can drop its link (the public-API mode): it then runs as one without a token", () => {
    const session = new Session(makeSettings(), new Link(Target.of("http://polar.test"), "token", new PythonRandom(1), (n) => new Uint8Array(n)));
    assert.notEqual(session.remote, null);
    session.dropLink();
    assert.equal(session.remote, null);
    assert.deepEqual(session.linkStatus(), ["none", null]);
    session.dropLink(); // twice: nothing more to do
    assert.equal(session.remote, null);
  });

  it("stores Polar's configuration, leaves a malformed reducer out, and prefers Polar's to a cache", () => {
    const session = configured();
    assert.equal(session.rejections.get("configuration"), 1);
    const [store] = session.effects();
    assert.equal(store?.kind, "StoreConfiguration");
    session.handle({ kind: "ConfigurationReceived", payload: { reducers: [] }, fromCache: true });
    assert.ok(session.configuration?.reducers.has("r-count"), "a cached configuration does not replace Polar's");
    session.handle({ kind: "ConfigurationReceived", payload: "garbage", fromCache: false });
    assert.equal(session.rejections.get("configuration"), 2);
  });

  it("raises at once for a caller's mistakes", () => {
    assert.throws(() => new Session().track({ name: "a", externalCustomerId: "c1", timestampUs: 1, nowUs: 1, eventId: "e" }), NotReady);
    const session = configured();
    const base = { name: "a", externalCustomerId: "c1", timestampUs: 1, nowUs: 1, eventId: "e" };
    assert.throws(() => session.track({ ...base, timestampUs: 2 }), /in the future/);
    assert.throws(() => session.track({ ...base, timestampUs: -1, nowUs: 1 }), /before 1970/);
    assert.throws(() => session.track({ ...base, customerId: "x" }), /exactly one/);
    assert.throws(() => session.track({ ...base, metadata: { tokens: 1e301 } }), InvalidEvent);
    assert.throws(() => session.read("m-nope", "c1"), UnknownMeter);
    assert.throws(() => session.read("m-unique", "c1"), UnsupportedMeter);
    assert.throws(() => session.read("", "c1"), UsageError);
    assert.throws(() => makeSettings({ snapshotTimeout: -1 }), UsageError);
    assert.throws(() => makeSettings({ reloadRetry: 0 }), UsageError);
    assert.throws(() => makeSettings({ pendingLimitUs: 0 }), UsageError);
    assert.throws(() => session.handle({ kind: "BytesReceived", now: 0, data: new Uint8Array() }), UsageError);
  });

  it("tracks into every reducer the event counts in, with the revision it holds", () => {
    const session = configured();
    const run = session.track({ name: "a", externalCustomerId: "c1", metadata: { user: "u" }, timestampUs: 300_000_001, nowUs: 300_000_001, eventId: "e1" });
    assert.deepEqual(run.keys, ["outpost:v2:{10}:outbox", KEY, `${KEY}:ev:300000000`]);
    assert.deepEqual(run.args.slice(1, 3), ["300000000:e1", "300000000"]);
    assert.deepEqual(run.args.slice(5), ["-1", "1"]);
    assert.deepEqual(run.meterIds, ["m-count"]);
  });

  it("follows a copy: load, deltas in order, gaps reload, a failed load retries", () => {
    const session = configured();
    session.handle({ kind: "SubscriberRestarted" });
    session.effects();
    assert.equal(session.read("m-count", "c1"), null);
    assert.deepEqual(session.effects(), [{ kind: "LoadIdentity", key: KEY, loadId: 1 }]);
    session.handle({ kind: "IdentityLoaded", key: KEY, fields: new Map([["rev", "5"], ["cu", "0"], ["p", "2 2 1 1"], ["a:300000000", "1 1 1 1"], ["c:m-count", "10"], ["n", "1"], ["u", "1"]]), loadId: 1 });
    const balance = session.read("m-count", "c1") as Balance;
    assert.equal(balance.consumed, 3);
    assert.equal(balance.balance, 7);
    assert.equal(balance.source, "memory");
    assert.equal(session.cachedBalance("m-count", "c1", null), balance);
    session.handle({ kind: "ChangePublished", data: JSON.stringify({ c: [{ k: KEY, r: 6, s: ["a:300000000", "2 2 1 1"], d: {} }] }) });
    assert.equal(session.cachedBalance("m-count", "c1", null), null);
    assert.equal((session.read("m-count", "c1") as Balance).consumed, 4);
    session.handle({ kind: "ChangePublished", data: JSON.stringify({ c: [{ k: KEY, r: 9, s: [], d: [] }] }) });
    assert.deepEqual(session.effects(), [{ kind: "LoadIdentity", key: KEY, loadId: 2 }]);
    assert.equal(session.read("m-count", "c1"), null);
    session.handle({ kind: "Tick", now: 1, wallUs: 0 });
    session.handle({ kind: "LoadFailed", key: KEY, loadId: 1 }); // an older load's failure: ignored
    assert.equal(session.nextDeadline(), 10);
    session.handle({ kind: "LoadFailed", key: KEY, loadId: 2 });
    assert.equal(session.nextDeadline(), 1.375); // the first retry's backoff, mid-jitter
    session.handle({ kind: "Tick", now: 1.375, wallUs: 0 });
    assert.deepEqual(session.effects(), [{ kind: "LoadIdentity", key: KEY, loadId: 3 }]);
    session.handle({ kind: "IdentityLoaded", key: KEY, fields: { rev: "8", cu: "0", "a:300000000": "3 3 1 1" }, loadId: 3 });
    assert.equal((session.read("m-count", "c1") as Balance).revision, 9);
    session.handle({ kind: "SubscriberRestarted" });
    assert.deepEqual(session.effects(), [{ kind: "LoadIdentity", key: KEY, loadId: 4 }]);
  });

  it("counts a field that is not UTF-8 text once however often a fresh read fetches it", () => {
    const session = configured();
    session.handle({ kind: "SubscriberRestarted" });
    assert.equal(session.read("m-count", "c1"), null);
    session.handle({ kind: "IdentityLoaded", key: KEY, fields: { rev: "5", cu: "0", "c:m-count": "10" }, loadId: 1 });
    const fields = new Map<unknown, unknown>([["rev", "5"], ["cu", "0"], ["c:m-count", "10"], [new Uint8Array([0xff]), "1"]]);
    for (let i = 0; i < 3; i++) {
      // A fresh read per call: one warning in all, not one per call.
      assert.deepEqual(session.read("m-count", "c1", null, true), { kind: "Fetch", keys: [KEY] });
      assert.equal(session.readFetched("m-count", "c1", null, { [KEY]: fields })?.balance, 10);
    }
    assert.deepEqual([...session.rejections], [["configuration", 1], ["state", 1]]);
    assert.equal(session.reports().filter((r) => r.level === "warning" && r.message.includes("not UTF-8")).length, 1);
    const other = new Map<unknown, unknown>([...fields].map(([name, value]) => [name, name instanceof Uint8Array ? "2" : value]));
    session.readFetched("m-count", "c1", null, { [KEY]: other }); // other bytes: counted anew
    assert.equal(session.rejections.get("state"), 2);
  });

  it("reads Redis while its copy does not follow: a broken subscription, or fresh", () => {
    const session = configured();
    const fields = { rev: "5", cu: "0", "a:300000000": "1 1 1 1", "c:m-count": "10" };
    assert.equal(session.read("m-count", "c1"), null); // never subscribed: wait for it
    session.handle({ kind: "IdentityLoaded", key: KEY, fields, loadId: 1 });
    assert.equal(session.read("m-count", "c1"), null);
    assert.deepEqual(session.read("m-count", "c1", null, true), { kind: "Fetch", keys: [KEY] });
    assert.match(session.notReadyReason("m-count", "c1", null), /not confirmed the subscription/);
    session.handle({ kind: "SubscriptionConfirmed", count: 16 });
    session.handle({ kind: "IdentityLoaded", key: KEY, fields, loadId: 2 });
    assert.equal((session.read("m-count", "c1") as Balance).source, "memory");
    session.handle({ kind: "SubscriptionConfirmed", count: 1 }); // a re-subscription: lost
    assert.equal(session.subscribed, false);
    assert.deepEqual(session.read("m-count", "c1"), { kind: "Fetch", keys: [KEY] });
    const fetched = session.readFetched("m-count", "c1", null, { [KEY]: { ...fields, rev: "6", "a:300000000": "2 2 1 1" } });
    assert.equal(fetched?.source, "redis");
    assert.equal(fetched?.consumed, 2);
    assert.throws(() => session.readFetched("m-count", "c1", null, {}), UsageError);
    assert.equal(session.readFetched("m-count", "c1", null, { [KEY]: { rev: "7" } }), null); // no snapshot
    session.handle({ kind: "SubscriberLost" });
    session.handle({ kind: "SubscriberRestarted" });
    assert.equal(session.everSubscribed, true);
  });

  /** A session whose copy of c1 follows Redis, loaded with the fields returned beside it. */
  function followingC1(): [Session, Record<string, string>] {
    const session = configured();
    const fields = { rev: "5", cu: "0", "a:300000000": "1 1 1 1", "c:m-count": "10" };
    session.handle({ kind: "SubscriptionConfirmed", count: 16 });
    session.read("m-count", "c1");
    session.handle({ kind: "IdentityLoaded", key: KEY, fields, loadId: 1 });
    return [session, fields];
  }

  it("reads a hash fetched again unchanged as before, and one changed at the same revision anew", () => {
    const [session, fields] = followingC1();
    const first = session.readFetched("m-count", "c1", null, { [KEY]: { ...fields } });
    assert.deepEqual(session.readFetched("m-count", "c1", null, { [KEY]: { ...fields } }), first);
    // The same revision with other content (Redis lost writes and wrote it again): what Redis holds now.
    const changed = session.readFetched("m-count", "c1", null, { [KEY]: { ...fields, "a:300000000": "3 3 1 1" } });
    assert.deepEqual([changed?.revision, changed?.consumed], [5, 3]);
  });

  it("still moves a copy that went back since a hash fetched again unchanged", () => {
    const [session, fields] = followingC1();
    const newer = { ...fields, rev: "9", "a:300000000": "4 4 1 1" };
    session.readFetched("m-count", "c1", null, { [KEY]: newer });
    const copy = session.followed[0];
    assert.equal(copy?.rev, 9);
    session.effects();
    session.handle({ kind: "SubscriberRestarted" }); // the copy reloads, and Redis answers an older hash
    const load = session.effects().find((e) => e.kind === "LoadIdentity");
    assert.ok(load?.kind === "LoadIdentity");
    session.handle({ kind: "IdentityLoaded", key: KEY, fields, loadId: load.loadId });
    assert.equal(copy?.rev, 5);
    session.readFetched("m-count", "c1", null, { [KEY]: { ...newer } });
    assert.deepEqual([copy?.rev, copy?.fields.get("a:300000000")], [9, "4 4 1 1"]);
  });

  it("follows shard by shard: a lost channel sends only its shard's reads to Redis and reloads only it", () => {
    const fields = { rev: "5", cu: "0", "a:300000000": "1 1 1 1", "c:m-count": "10" };
    const session = configured();
    session.read("m-count", "c1");
    const first = session.effects().find((e) => e.kind === "LoadIdentity");
    assert.equal(first?.kind === "LoadIdentity" && first.key, KEY);
    for (let shard = 0; shard < 16; shard++) {
      if (shard !== 10) session.handle({ kind: "ChannelSubscribed", channel: `outpost:v2:{${shard}}:changes` });
    }
    assert.equal(session.subscribed, false); // c1's shard (10) is not confirmed yet
    session.handle({ kind: "ChannelSubscribed", channel: new TextEncoder().encode("outpost:v2:{10}:changes") });
    assert.equal(session.subscribed && session.everSubscribed, true);
    const reload = session.effects().find((e) => e.kind === "LoadIdentity");
    assert.ok(reload?.kind === "LoadIdentity" && reload.key === KEY, "the shard's copy reloads");
    session.handle({ kind: "IdentityLoaded", key: KEY, fields, loadId: reload.loadId });
    assert.equal((session.read("m-count", "c1") as Balance).source, "memory");
    session.handle({ kind: "ChannelsLost", channels: ["outpost:v2:{3}:changes"] }); // another shard
    assert.equal(session.subscribed, false);
    assert.equal((session.read("m-count", "c1") as Balance).source, "memory"); // still following
    session.handle({ kind: "ChannelsLost", channels: ["outpost:v2:{10}:changes"] });
    assert.deepEqual(session.read("m-count", "c1"), { kind: "Fetch", keys: [KEY] });
    session.handle({ kind: "ChannelsLost", channels: ["someone:else", 7] });
    assert.equal(session.rejections.get("subscription"), 2);
  });

  it("counts and reports what a peer got wrong, and carries on", () => {
    const session = new Session();
    session.handle({ kind: "ConfigurationReceived", payload: CONFIGURATION, fromCache: false });
    session.read("m-count", "c1");
    const followed = ['{"c":[{"k":"x"}]}', '{"c":[{"k":"x","r":1,"s":["a"]}]}', '{"c":[{"k":"x","r":1,"s":[1,2]}]}'].map((t) => t.replace('"x"', JSON.stringify(KEY)));
    for (const data of ["not json", "[]", '{"c":[1]}', '{"c":[{"r":1}]}', ...followed, new Uint8Array([0xff]), 42]) {
      session.handle({ kind: "ChangePublished", data });
    }
    assert.equal(session.rejections.get("change"), 9);
    // A change of a key it does not follow is left unread: not even counted when malformed.
    session.handle({ kind: "ChangePublished", data: '{"c":[{"k":"not-followed","r":"x","s":7}]}' });
    assert.equal(session.rejections.get("change"), 9);
    session.handle({ kind: "IdentityLoaded", key: KEY, fields: new Map<unknown, unknown>([["rev", "x"], ["a:1", "garbage"], ["c:m", "nan"], ["p", "1"], [new Uint8Array([0xff]), "1"]]), loadId: 1 });
    assert.equal(session.rejections.get("state"), 5);
    const warnings = session.reports().filter((r) => r.level === "warning");
    assert.equal(warnings.length, 15); // and the malformed reducer of the configuration
    assert.ok(warnings.every((r) => r.message.startsWith("outpost rejected ")));
  });
});
