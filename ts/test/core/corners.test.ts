/** The core's corners the flows above pass by: unasked-for snapshots, a Polar that errs mid-flow,
 * loads that cross each other, why a read waits, merged names, and the small helpers. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { coldListing } from "../support/coldListing.js";
import { Aggregate, EMPTY } from "../../src/core/aggregate.js";
import { Balance, computeBalance, mergedState } from "../../src/core/balance.js";
import type { Effect } from "../../src/core/effects.js";
import { InvalidEvent } from "../../src/core/errors.js";
import { eventIdOf, timestampUsOf } from "../../src/core/event.js";
import { Customer, namespaceOfDatabase } from "../../src/core/keys.js";
import { Link, Target } from "../../src/core/link.js";
import { Mirror, Offer, deriveState } from "../../src/core/mirror.js";
import { Remote } from "../../src/core/remote.js";
import { PortForRemote, Session, makeSettings } from "../../src/core/session.js";
import { parseSnapshot } from "../../src/core/snapshots.js";
import { parseAggregation, parseFilter } from "../../src/core/filters.js";
import { jsonbText, sqlEpochSeconds, sqlMatches, sqlValue } from "../../src/core/sqlFilters.js";
import { replayBytes } from "../../src/core/trace.js";
import { acceptFor, decodeClientFrames } from "../../src/core/websocket.js";

const te = new TextEncoder();
const KEY = "outpost:v2:{10}:external:c1:r-count";
const CONFIGURATION = {
  reducers: [{ id: "r-count", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "count" }, meter_ids: ["m-count"] }],
};
const frame = (message: unknown): Uint8Array => {
  const payload = te.encode(JSON.stringify(message));
  const head = payload.length < 126 ? [0x81, payload.length] : [0x81, 126, payload.length >> 8, payload.length & 0xff];
  return Uint8Array.from([...head, ...payload]);
};
const sent = (effects: Effect[]): any[] =>
  effects.flatMap((e) => (e.kind === "SendBytes" ? decodeClientFrames(e.data).filter(([op]) => op === "TEXT").map(([, t]) => JSON.parse(t as string)) : []));

/** A session whose link is open and configured, subscribed, c1's copy loaded. */
function connected(): { session: Session; send: (m: unknown) => Effect[]; requestId: string } {
  const session = new Session(makeSettings(), new Link(Target.of("http://polar"), "t", { random: () => 0.5 }, replayBytes()));
  session.handle({ kind: "SubscriberRestarted" });
  session.handle({ kind: "Tick", now: 0, wallUs: 1_000 });
  session.handle({ kind: "ConnectionOpened", now: 0 });
  const [upgrade] = session.effects().filter((e) => e.kind === "SendBytes");
  const key = /sec-websocket-key: (\S+)/.exec(Buffer.from((upgrade as { data: Uint8Array }).data).toString("latin1"))?.[1] as string;
  session.handle({ kind: "BytesReceived", now: 0, data: te.encode(`HTTP/1.1 101 S\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${acceptFor(key)}\r\n\r\n`) });
  const send = (m: unknown): Effect[] => {
    session.handle({ kind: "BytesReceived", now: 0, data: frame(m) });
    return session.effects();
  };
  send({ type: "configuration", payload: CONFIGURATION });
  assert.equal(session.read("m-count", "c1"), null);
  const [request] = sent(session.effects());
  session.handle({ kind: "IdentityLoaded", key: KEY, fields: { rev: "3" }, loadId: 1 });
  return { session, send, requestId: request.payload.request_id };
}

const snapshot = (extra: Record<string, unknown> = {}) => ({
  type: "snapshot",
  payload: { snapshot_id: "s-1", external_customer_id: "c1", as_of: 2, cold_until: 0, reducers: { "r-count": { count: 0, sum: 0 } }, credited: {}, ...extra },
});


describe("the core's corners", () => {
  it("applies an unasked-for snapshot, and restarts a flow Polar errs in", () => {
    const { session, send, requestId } = connected();
    const [list] = send(snapshot({ external_customer_id: "other", request_id: null }));
    assert.equal(list?.kind, "ListPending");
    const listed = send(snapshot({ request_id: requestId, cold_until: 600_000_000 })).find((e) => e.kind === "ListPending") as { tag: number };
    session.handle({ kind: "PendingListed", tag: coldListing(session, KEY, listed.tag), fields: { [`${KEY}:ev:300000000`]: [new Uint8Array([0xff]), "300000000:e1"] } });
    assert.equal(session.rejections.get("state"), 1);
    const [question] = sent(session.effects());
    const restarted = send({ type: "counted", payload: { request_id: question.payload.request_id, event_ids: "e1" } });
    assert.equal(sent(restarted)[0].type, "snapshot");
    const again = send(snapshot({ cold_until: 600_000_000 })).find((e) => e.kind === "ListPending") as { tag: number };
    session.handle({ kind: "PendingListed", tag: coldListing(session, KEY, again.tag), fields: { [`${KEY}:ev:300000000`]: ["300000000:e1"] } });
    const [second] = sent(session.effects());
    const errored = send({ type: "error", payload: { request_id: second.payload.request_id, code: "internal", message: "oops" } });
    assert.equal(sent(errored)[0].type, "snapshot");
    assert.equal(session.rejections.get("counted"), 1);
    assert.equal(session.rejections.get("error"), 1);
  });

  it("keeps nothing of an unasked-for snapshot once it is done or given up, and asks Polar nothing", () => {
    const { session, send } = connected();
    const remote = session.remote as Remote;
    const other = "external:other";
    // Given up (Redis failed the listing): let go, no retry that would ask Polar.
    const [list] = send(snapshot({ external_customer_id: "other", request_id: null }));
    assert.equal(remote.flows.get(other)?.pushed, true);
    session.handle({ kind: "ListFailed", tag: (list as { tag: number }).tag });
    assert.deepEqual(sent(session.effects()), []);
    assert.equal(remote.flows.has(other), false);
    session.handle({ kind: "Tick", now: 10.5, wallUs: 1_000 }); // past any retry's backoff
    assert.deepEqual(sent(session.effects()).filter((m) => m.payload?.external_customer_id === "other"), []);
    // Read while it applies: followed from then on, so asked for.
    send(snapshot({ external_customer_id: "other", request_id: null }));
    remote.follow(remote.flows.get(other)!.customer);
    assert.equal(remote.flows.get(other)?.pushed, false);
    assert.equal(sent(session.effects())[0].type, "snapshot");
  });

  it("says loudly once why Polar refused the WebSocket, and why reads wait", () => {
    const session = new Session(makeSettings(), new Link(Target.of("http://polar"), "t", { random: () => 0.5 }, replayBytes()));
    assert.deepEqual(new Session().linkStatus(), ["none", null]);
    assert.equal(new Session().notReadyReason("m", "c1", null), "no configuration from Polar yet (WebSocket none)");
    session.handle({ kind: "Tick", now: 0, wallUs: 0 });
    session.handle({ kind: "ConnectionOpened", now: 0 });
    session.handle({ kind: "BytesReceived", now: 0, data: te.encode("HTTP/1.1 401 No\r\ncontent-length: 0\r\n\r\n") });
    const loud = session.reports().filter((r) => r.level === "error" || r.level === "warning");
    assert.deepEqual(loud, [{ level: "error", message: "outpost: Polar refused the WebSocket with HTTP 401" }]); // one sentence, at ERROR as in Python
    assert.equal(session.notReadyReason("m", "c1", null), "no configuration from Polar yet (WebSocket disconnected: Polar refused the WebSocket with HTTP 401)");
  });

  it("tells a 404 (Polar serving only its public API) at information, not as a warning", () => {
    const session = new Session(makeSettings(), new Link(Target.of("http://polar"), "t", { random: () => 0.5 }, replayBytes()));
    session.handle({ kind: "Tick", now: 0, wallUs: 0 });
    session.handle({ kind: "ConnectionOpened", now: 0 });
    session.handle({ kind: "BytesReceived", now: 0, data: te.encode("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n") });
    assert.equal(session.remote?.link.refusedStatus, 404);
    assert.deepEqual(session.reports(), [{ level: "info", message: "outpost: Polar refused the WebSocket with HTTP 404" }]);
  });

  it("names the refusal when a meter is missing from the cached configuration", () => {
    const session = new Session(makeSettings(), new Link(Target.of("http://polar"), "t", { random: () => 0.5 }, replayBytes()));
    session.handle({ kind: "ConfigurationReceived", payload: CONFIGURATION, fromCache: true }); // an earlier token's
    session.handle({ kind: "Tick", now: 0, wallUs: 0 });
    session.handle({ kind: "ConnectionOpened", now: 0 });
    session.handle({ kind: "BytesReceived", now: 0, data: te.encode('HTTP/1.1 401 No\r\ncontent-length: 27\r\n\r\n{"detail":"invalid token"}\n') });
    assert.equal(
      session.notReadyReason("m-new", "c1", null),
      "meter 'm-new' is not in the configuration cached in Redis and Polar's has not arrived " +
        "(WebSocket disconnected: Polar refused the WebSocket with HTTP 401: invalid token)",
    );
  });

  it("reports Polar unreachable once, a reminder a minute, and one line when it is back", () => {
    const link = new Link(Target.of("http://polar"), "t", { random: () => 0.5 }, replayBytes());
    const session = new Session(makeSettings(), link);
    session.handle({ kind: "Tick", now: 0, wallUs: 0 });
    session.effects();
    for (const now of [2, 3, 30, 63, 64]) session.handle({ kind: "ConnectionFailed", now, reason: "cannot connect: connection refused" });
    const now = Math.max(70, link.retryAt);
    session.handle({ kind: "Tick", now, wallUs: 0 });
    assert.deepEqual(session.effects().map((e) => e.kind), ["OpenConnection"]);
    session.handle({ kind: "ConnectionOpened", now });
    const [upgrade] = session.effects().filter((e) => e.kind === "SendBytes");
    const key = /sec-websocket-key: (\S+)/.exec(Buffer.from((upgrade as { data: Uint8Array }).data).toString("latin1"))?.[1] as string;
    session.handle({ kind: "BytesReceived", now, data: te.encode(`HTTP/1.1 101 S\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${acceptFor(key)}\r\n\r\n`) });
    assert.ok(session.connected);
    const lines = session.reports().filter((r) => r.level !== "debug").map((r) => `${r.level} ${r.message}`);
    assert.deepEqual(lines, [
      "warning outpost: Polar unreachable for the WebSocket: cannot connect: connection refused",
      "warning outpost: Polar still unreachable for the WebSocket after 61 s: cannot connect: connection refused",
      `info outpost: Polar is back for the WebSocket after ${(now - 2).toFixed(1)} s`,
    ]);
  });

  it("ignores a load that a newer one replaced, and backs off from a gap loads keep leaving", () => {
    const session = new Session();
    session.handle({ kind: "ConfigurationReceived", payload: CONFIGURATION, fromCache: false });
    session.handle({ kind: "SubscriberRestarted" });
    session.read("m-count", "c1");
    session.handle({ kind: "ChangePublished", data: JSON.stringify({ c: [{ k: KEY, r: 9, s: ["n", "1"], d: [] }] }) }); // held
    session.handle({ kind: "SubscriberRestarted" }); // load 2 replaces load 1
    session.handle({ kind: "IdentityLoaded", key: KEY, fields: { rev: "1" }, loadId: 1 });
    assert.equal(session.followed[0]?.loaded, false);
    session.handle({ kind: "IdentityLoaded", key: KEY, fields: { rev: "5" }, loadId: 2 }); // 9 is no next revision
    assert.deepEqual(session.effects().at(-1), { kind: "LoadIdentity", key: KEY, loadId: 3 }); // at once, the first time
    session.handle({ kind: "IdentityLoaded", key: KEY, fields: { rev: "6" }, loadId: 3 });
    assert.equal(session.nextDeadline(), 0.75); // then after a backoff (the second failure in a row)
    session.handle({ kind: "Tick", now: 0.75, wallUs: 0 });
    session.handle({ kind: "IdentityLoaded", key: KEY, fields: { rev: "8" }, loadId: 4 });
    assert.equal(session.followed[0]?.rev, 9);
    session.handle({ kind: "IdentityLoaded", key: "another", fields: {}, loadId: 1 });
    session.handle({ kind: "LoadFailed", key: "another", loadId: 1 });
  });

  it("names the other name whose state could not be loaded", () => {
    const { session, send, requestId } = connected();
    send(snapshot({ request_id: requestId, aliases: { customer_id: "00000000-0000-4000-8000-000000000001" } }));
    assert.match(session.notReadyReason("m-count", "c1", null), /\(another name of external:c1\) could not be loaded/);
  });

  it("follows a hash gone back in time, and keeps a copy newer than a repeated answer", () => {
    const mirror = new Mirror(KEY, new Customer("external", "c1"), "r");
    const first = mirror.startLoad(true);
    mirror.loadedWith(new Map([["rev", "50"], ["n", "50"]]), first);
    assert.equal(mirror.offer({ key: KEY, rev: 51, set: [["n", "51"]], deleted: [], full: false }), Offer.APPLIED);
    mirror.loadedWith(new Map([["rev", "50"], ["n", "50"]]), first); // the same load answered again
    assert.deepEqual([mirror.rev, mirror.fields.get("n")], [51, "51"]);
    mirror.loadedWith(new Map([["rev", "45"], ["n", "45"]]), mirror.startLoad(true)); // Redis lost 46-51
    assert.deepEqual([mirror.rev, mirror.fields.get("n"), mirror.loaded], [45, "45", true]);
    assert.equal(mirror.offer({ key: KEY, rev: 46, set: [["n", "46"]], deleted: [], full: false }), Offer.APPLIED);
  });

  it("reloads a copy behind what this instance wrote, merges names by the newest snapshot", () => {
    const mirror = new Mirror(KEY, new Customer("external", "c1"), "r");
    mirror.loadedWith(new Map([["rev", "3"]]), mirror.startLoad(true));
    assert.equal(mirror.offer({ key: KEY, rev: 2, set: null, deleted: [], full: false }), Offer.IGNORED);
    assert.equal(mirror.offer({ key: KEY, rev: 4, set: null, deleted: [], full: false }), Offer.GAP);
    const state = (fields: Record<string, string>) => deriveState(new Map(Object.entries(fields)));
    const own = state({ rev: "1", cu: "10", sa: "5", p: "1 1 1 1", n: "1" });
    const newer = state({ rev: "2", cu: "10", sa: "6", p: "2 2 1 1", n: "2", "c:m": "9" });
    const none = state({ rev: "3", n: "4", "a:0": "4 4 1 1" });
    const merged = mergedState(own, [none, newer]);
    assert.deepEqual([merged.asOf, merged.polar.count, merged.pending, merged.local.count], [6, 2, 7, 4]);
    const balance = computeBalance("m", new Customer("external", "c1"), "count", merged);
    assert.equal(balance.credited, 9);
    assert.deepEqual([balance.coldUntil, balance.snapshotAsOf], [new Date(0), new Date(0)]);
    assert.equal(balance.fromRedis().source, "redis");
    assert.ok(balance instanceof Balance);
    const cold = computeBalance("m", new Customer("external", "c1"), "count", none);
    assert.deepEqual([cold.coldUntil, cold.snapshotAsOf], [null, null]);
  });

  it("checks an event's time and id, and reads every aggregation", () => {
    assert.equal(timestampUsOf(undefined, 7), 7);
    assert.equal(timestampUsOf(new Date(2), 7), 2000);
    assert.throws(() => timestampUsOf(new Date(Number.NaN), 7), InvalidEvent);
    assert.throws(() => timestampUsOf("2026-01-01", 7), InvalidEvent);
    assert.equal(eventIdOf(null, "new"), "new");
    assert.equal(eventIdOf("mine", "new"), "mine");
    assert.throws(() => eventIdOf(5, "new"), InvalidEvent);
    const agg = new Aggregate(2, 6, 1, 5);
    assert.deepEqual(["count", "sum", "avg", "min", "max"].map((f) => agg.quantity(f)), [2, 6, 3, 1, 5]);
    assert.deepEqual(["avg", "min", "max"].map((f) => EMPTY.quantity(f)), [0, 0, 0]);
    assert.throws(() => agg.quantity("unique"), RangeError);
    assert.deepEqual([namespaceOfDatabase(0), namespaceOfDatabase(3)], ["", "db3"]);
  });

  it("refuses every malformed snapshot field, naming it", () => {
    const good = { snapshot_id: "s", external_customer_id: "c", as_of: 1, cold_until: 0, reducers: {}, credited: {} };
    assert.equal(parseSnapshot(good).customer.tag, "external:c");
    assert.equal(parseSnapshot({ ...good, external_customer_id: undefined, customer_id: "u" }).customer.tag, "customer:u");
    const bad: [Record<string, unknown>, RegExp][] = [
      [{ snapshot_id: "" }, /snapshot_id/],
      [{ request_id: 5 }, /request_id/],
      [{ as_of: -1 }, /as_of/],
      [{ cold_until: 1.5 }, /cold_until/],
      [{ cold_until: 7 }, /bucket boundary/],
      [{ reducers: [] }, /must be objects/],
      [{ credited: null }, /must be objects/],
      [{ reducers: { r: "x" } }, /reducer 'r'/],
      [{ credited: { m: "1" } }, /credited\['m'\]/],
      [{ customer_id: "u" }, /exactly one/],
      [{ aliases: { external_customer_id: 1, customer_id: "x" } }, /reference form/],
    ];
    for (const [fields, reason] of bad) assert.throws(() => parseSnapshot({ ...good, ...fields }), reason, JSON.stringify(fields));
    assert.throws(() => parseSnapshot("x"), /not an object/);
  });

  it("writes ->> texts and SQL values as Postgres does, where the differential inputs do not go", () => {
    const view = { name: "a", timestampS: 10, metadata: { n: -0.00025, z: -0, big: 1.5e-7, t: true, s: "x" }, source: "system" };
    assert.deepEqual(Object.values(view.metadata).map(jsonbText), ["-0.00025", "0", "0.00000015", "true", "x"]);
    assert.equal(jsonbText(null), "null");
    assert.equal(sqlValue(parseAggregation({ func: "count" }), view), 1);
    assert.equal(sqlValue(parseAggregation({ func: "sum", property: "source" }), view), null);
    assert.equal(sqlValue(parseAggregation({ func: "sum", property: "t" }), view), null);
    assert.equal(sqlEpochSeconds({ name: "a", timestampS: 10, metadata: {} }), 10);
    const source = parseFilter({ conjunction: "and", clauses: [{ property: "source", operator: "eq", value: "system" }] });
    assert.equal(sqlMatches(source, view), true);
    assert.equal(sqlMatches(source, { ...view, source: undefined }), false); // "user" when unset
    const like = (value: string) => parseFilter({ conjunction: "and", clauses: [{ property: "s", operator: "like", value }] });
    assert.equal(sqlMatches(like("x\\"), view), false); // a trailing backslash escapes the closing %
    for (let k = 0; k < 300; k++) sqlMatches(like(`%${k}`), view); // the pattern cache stays bounded
    assert.equal(sqlMatches(like("_"), view), true);
  });

  it("refuses a caller's time that is not whole microseconds, and reads no copy it does not follow", () => {
    const session = new Session();
    session.handle({ kind: "ConfigurationReceived", payload: CONFIGURATION, fromCache: false });
    assert.throws(() => session.track({ name: "a", externalCustomerId: "c1", timestampUs: 1.5, nowUs: 2, eventId: "e" }), /integer number of microseconds/);
    assert.deepEqual(new PortForRemote(session).consumed(new Customer("external", "c1"), "r-count"), new Map()); // what Polar's side reads
    session.handle({ kind: "SubscriberRestarted" });
    session.read("m-count", "c1");
    session.handle({ kind: "IdentityLoaded", key: KEY, fields: { rev: "2" }, loadId: 1 });
    assert.match(session.notReadyReason("m-count", "c1", null), /no snapshot for external:c1 in Redis yet \(this instance has no access token\)/);
    assert.equal(session.read("m-count", "c1"), null);
    assert.equal(session.readFetched("m-count", "c1", null, new Map([[KEY, { rev: "2" }]])), null);
  });
});
