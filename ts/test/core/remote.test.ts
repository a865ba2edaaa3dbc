/** Polar's side of the session without I/O: snapshot requests, the counted question, applying,
 * restarts, and what a misbehaving Polar sends. Polar's frames are built here. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { coldListing } from "../support/coldListing.js";
import type { Effect } from "../../src/core/effects.js";
import { Link, Target } from "../../src/core/link.js";
import { Session, makeSettings } from "../../src/core/session.js";
import type { Balance } from "../../src/core/balance.js";
import { replayBytes } from "../../src/core/trace.js";
import { acceptFor, decodeClientFrames } from "../../src/core/websocket.js";

const te = new TextEncoder();
const KEY = "outpost:v2:{10}:external:c1:r-count";
const CONFIGURATION = {
  organization_id: "org",
  reducers: [{ id: "r-count", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "count" }, meter_ids: ["m-count"] }],
};

function frame(message: unknown): Uint8Array {
  const payload = te.encode(typeof message === "string" ? message : JSON.stringify(message));
  const head = payload.length < 126 ? [0x81, payload.length] : [0x81, 126, payload.length >> 8, payload.length & 0xff];
  return Uint8Array.from([...head, ...payload]);
}

/** What the client sent in these effects: the JSON messages of its text frames. */
function sent(effects: Effect[]): any[] {
  return effects.flatMap((e) => (e.kind === "SendBytes" ? decodeClientFrames(e.data).filter(([op]) => op === "TEXT").map(([, text]) => JSON.parse(text as string)) : []));
}

class Polar {
  readonly session: Session;
  now = 0;

  constructor(settings = makeSettings()) {
    this.session = new Session(settings, new Link(Target.of("http://polar"), "t", { random: () => 0.5 }, replayBytes()));
    this.session.handle({ kind: "SubscriberRestarted" });
    this.session.handle({ kind: "Tick", now: 0, wallUs: 1_000 });
    assert.equal(this.session.effects()[0]?.kind, "OpenConnection");
    this.session.handle({ kind: "ConnectionOpened", now: 0 });
    const [upgrade] = this.session.effects();
    const request = Buffer.from((upgrade as { data: Uint8Array }).data).toString("latin1");
    const key = /sec-websocket-key: (\S+)/.exec(request)?.[1] as string;
    const answer = `HTTP/1.1 101 S\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${acceptFor(key)}\r\n\r\n`;
    this.push(te.encode(answer));
    assert.deepEqual(sent(this.session.effects()), [{ type: "configuration" }]);
    this.push(frame({ type: "configuration", payload: CONFIGURATION }));
    this.session.effects();
  }

  push(data: Uint8Array): void {
    this.session.handle({ kind: "BytesReceived", now: this.now, data });
  }

  send(message: unknown): Effect[] {
    this.push(frame(message));
    return this.session.effects();
  }

  /** Follow c1 with a loaded copy: returns the snapshot request's id. */
  follow(fields: Record<string, string> = { rev: "3" }): string {
    assert.equal(this.session.read("m-count", "c1"), null);
    const effects = this.session.effects();
    const [request] = sent(effects);
    assert.equal(request.type, "snapshot");
    this.session.handle({ kind: "IdentityLoaded", key: KEY, fields, loadId: 1 });
    this.session.effects();
    return request.payload.request_id;
  }
}

const snapshot = (requestId: string | null, extra: Record<string, unknown> = {}) => ({
  type: "snapshot",
  payload: {
    snapshot_id: "s-1",
    request_id: requestId,
    external_customer_id: "c1",
    as_of: 600_000_001,
    cold_until: 600_000_000,
    reducers: { "r-count": { count: 2, sum: 2, min: 1, max: 1 } },
    credited: { "m-count": 10 },
    ...extra,
  },
});


describe("the remote side", () => {
  it("asks which pending events a snapshot counts, then applies it with the answer", () => {
    const polar = new Polar();
    const requestId = polar.follow();
    const [list] = polar.send(snapshot(requestId));
    assert.equal(list?.kind, "ListPending");
    const tag = (list as { tag: number }).tag;
    const events = coldListing(polar.session, KEY, tag);
    polar.session.handle({ kind: "PendingListed", tag: events, fields: new Map([[`${KEY}:ev:300000000`, ["300000000:e1", "300000000:e2", "900000000:e3", "bad", "x:e4"]]]) });
    assert.equal(polar.session.rejections.get("state"), 2);
    const [question] = sent(polar.session.effects());
    assert.deepEqual(question.payload.event_ids, ["e1", "e2"]);
    const [apply] = polar.send({ type: "counted", payload: { request_id: question.payload.request_id, event_ids: ["e2", "e9"] } });
    assert.equal(apply?.kind, "RunScript");
    const run = apply as { args: string[]; tag: number };
    assert.deepEqual(run.args, ["outpost:v2:{10}:changes", "1000", "3600000000", "600000000", "600000001", "s-1", "1", "m-count", "10", "3", "2 2 1 1", "1", "300000000:e2"]);
    polar.session.handle({ kind: "ScriptReplied", reply: JSON.stringify({ c: [{ k: KEY, r: 4, s: ["cu", "600000000", "p", "2 2 1 1", "c:m-count", "10"], d: [] }] }), tag: run.tag });
    const [applied] = polar.session.observations().filter((o) => o.kind === "SnapshotApplied");
    assert.equal(applied?.kind === "SnapshotApplied" && applied.counted, 1);
    assert.equal((polar.session.read("m-count", "c1") as Balance).balance, 8);
  });

  it("restarts after snapshot_expired, a failed listing or a failed apply, and queues a newer snapshot", () => {
    const polar = new Polar();
    const requestId = polar.follow();
    const [list] = polar.send(snapshot(requestId));
    assert.deepEqual(polar.send(snapshot(null, { snapshot_id: "s-0", cold_until: 0 })), []); // waits, older
    polar.session.handle({ kind: "ListFailed", tag: (list as { tag: number }).tag });
    assert.deepEqual(polar.session.effects(), []); // Redis failed: ask again after a backoff
    assert.equal(polar.session.nextDeadline(), 0.1875);
    polar.session.handle({ kind: "Tick", now: 0.1875, wallUs: 1_000 });
    assert.equal(sent(polar.session.effects())[0].type, "snapshot");
    const [again] = polar.send(snapshot(null));
    polar.session.handle({ kind: "PendingListed", tag: coldListing(polar.session, KEY, (again as { tag: number }).tag), fields: { [`${KEY}:ev:300000000`]: ["300000000:e1"] } });
    const [question] = sent(polar.session.effects());
    const restarted = polar.send({ type: "error", payload: { request_id: question.payload.request_id, code: "snapshot_expired", message: "too old" } });
    assert.equal(sent(restarted)[0].type, "snapshot");
    const [third] = polar.send(snapshot(null));
    polar.session.handle({ kind: "PendingListed", tag: (third as { tag: number }).tag, fields: { [KEY]: [] } }); // no bucket
    const [apply] = polar.session.effects();
    polar.session.handle({ kind: "ScriptFailed", tag: (apply as { tag: number }).tag });
    assert.deepEqual(polar.session.effects(), []);
    polar.session.handle({ kind: "Tick", now: 1, wallUs: 1_000 });
    assert.equal(sent(polar.session.effects())[0].type, "snapshot");
  });

  it("gives a step up that waits too long, and asks again", () => {
    const polar = new Polar();
    const requestId = polar.follow();
    polar.send(snapshot(requestId)); // listing, never answered
    assert.equal(polar.session.nextDeadline(), 10);
    polar.session.handle({ kind: "Tick", now: 10, wallUs: 1_000 });
    assert.equal(polar.session.rejections.get("stuck_flow"), 1);
    assert.equal(sent(polar.session.effects())[0].type, "snapshot");
  });

  it("follows a customer's other names: their pending events count too", () => {
    const polar = new Polar();
    const requestId = polar.follow({ rev: "3", n: "1", "a:300000000": "1 1 1 1" });
    const uuid = "0b0e0f00-0000-4000-8000-000000000001";
    const effects = polar.send(snapshot(requestId, { aliases: { customer_id: uuid.toUpperCase() } }));
    const list = effects.find((e) => e.kind === "ListPending");
    const load = effects.find((e) => e.kind === "LoadIdentity") as { key: string; loadId: number };
    assert.ok(load.key.includes(`customer:${uuid}:r-count`));
    polar.session.handle({ kind: "PendingListed", tag: (list as { tag: number }).tag, fields: {} });
    const [apply] = polar.session.effects();
    polar.session.handle({ kind: "ScriptReplied", reply: JSON.stringify({ c: [{ k: KEY, r: 4, s: ["cu", "600000000", "c:m-count", "10"], d: [] }] }), tag: (apply as { tag: number }).tag });
    assert.equal(polar.session.read("m-count", "c1"), null); // the alias's copy is not loaded yet
    polar.session.handle({ kind: "IdentityLoaded", key: load.key, fields: { rev: "2", n: "1", "a:900000000": "1 1 1 1" }, loadId: load.loadId });
    const balance = polar.session.read("m-count", "c1") as Balance;
    assert.equal(balance.pending, 2);
    assert.equal(balance.consumed, 2);
    assert.deepEqual(balance.aliases.map(String), [`customer:${uuid}`]);
    assert.deepEqual(polar.session.read("m-count", "c1", null, true), { kind: "Fetch", keys: [KEY, load.key] });
    for (const bad of [{ external_customer_id: "x" }, { customer_id: "nope" }, { customer_id: "" }, "x"]) {
      polar.send(snapshot(null, { aliases: bad }));
    }
    assert.equal(polar.session.rejections.get("snapshot"), 4);
  });

  it("counts what a misbehaving Polar sends, and carries on", () => {
    const polar = new Polar();
    polar.follow();
    polar.send("not json");
    polar.send({ no: "type" });
    polar.send({ type: "surprise" });
    polar.send(snapshot(null, { cold_until: 5 }));
    polar.send(snapshot(null, { reducers: { r: { count: -1, sum: 0 } } }));
    polar.send(snapshot(null, { external_customer_id: null }));
    polar.send({ type: "counted", payload: { request_id: "q-unknown", event_ids: [] } });
    polar.send({ type: "error", payload: "x" });
    polar.send({ type: "error", payload: { code: "boom", message: "no" } });
    assert.deepEqual(Object.fromEntries(polar.session.rejections), { frame: 3, snapshot: 3, counted: 1, error: 2 });
  });

  it("asks again for a customer whose state lost its snapshot, at most once per request timeout", () => {
    const polar = new Polar();
    const requestId = polar.follow();
    const [list] = polar.send(snapshot(requestId));
    polar.session.handle({ kind: "PendingListed", tag: (list as { tag: number }).tag, fields: {} });
    const [apply] = polar.session.effects();
    polar.session.handle({ kind: "ScriptReplied", reply: JSON.stringify({ c: [{ k: KEY, r: 4, s: ["cu", "600000000"], d: [] }] }), tag: (apply as { tag: number }).tag });
    assert.ok(polar.session.read("m-count", "c1"));
    polar.now = polar.session.remote!.now = 10;
    polar.session.handle({ kind: "ChangePublished", data: JSON.stringify({ c: [{ k: KEY, r: 5, s: [], d: ["cu"] }] }) });
    assert.equal(polar.session.read("m-count", "c1"), null);
    assert.equal(sent(polar.session.effects())[0].type, "snapshot");
    assert.equal(polar.session.read("m-count", "c1"), null);
    assert.deepEqual(sent(polar.session.effects()), []);
  });

  it("says why a read waits when the link is down, and closes for good", () => {
    const polar = new Polar();
    polar.follow();
    polar.session.handle({ kind: "ConnectionFailed", now: 1, reason: "reset" });
    const closed = polar.session.observations().find((o) => o.kind === "LinkChanged" && o.state === "closed");
    assert.ok(closed);
    assert.equal(polar.session.connected, false);
    assert.match(polar.session.notReadyReason("m-count", "c1", null), /WebSocket disconnected: reset/);
    polar.session.handle({ kind: "Closing" });
    // Only the customer's idle deadline is left (read before any tick: dated 0).
    assert.equal(polar.session.nextDeadline(), makeSettings().idleCustomerTtl);
  });
});

describe("asking again when no snapshot counted what Polar was delivered", () => {
  const REFRESH = 5; // shorter than the default ten minutes: the link's pings need no answers

  /** c1 followed and its first snapshot applied; then Polar pushes another that leaves `n`
   * events no snapshot counted, `u` of them not delivered yet. */
  function leaving(n: number, u: number, settings = makeSettings({ refreshAfter: REFRESH })): Polar {
    const polar = new Polar(settings);
    const requestId = polar.follow();
    for (const [id, rev, fields] of [
      [requestId, 4, []],
      [null, 5, ["n", String(n), "u", String(u)]],
    ] as const) {
      const [list] = polar.send(snapshot(id));
      polar.session.handle({ kind: "PendingListed", tag: (list as { tag: number }).tag, fields: { [KEY]: [] } });
      const [apply] = polar.session.effects();
      const reply = { c: [{ k: KEY, r: rev, s: ["cu", "600000000", "p", "2 2 1 1", ...fields], d: [] }] };
      polar.session.handle({ kind: "ScriptReplied", reply: JSON.stringify(reply), tag: (apply as { tag: number }).tag });
      assert.deepEqual(polar.session.effects(), []);
    }
    return polar;
  }

  function tick(polar: Polar, now: number): any[] {
    polar.now = now;
    polar.session.handle({ kind: "Tick", now, wallUs: 1_000 });
    return sent(polar.session.effects()).filter((m) => m.type === "snapshot");
  }

  it("asks once the wait is over, and again while the answer does not come", () => {
    const polar = leaving(5, 0);
    assert.deepEqual(tick(polar, REFRESH - 0.001), []);
    const [request] = tick(polar, REFRESH);
    assert.equal(request.payload.external_customer_id, "c1");
    assert.equal(tick(polar, 2 * REFRESH).length, 1);
  });

  it("waits for events still on their way to Polar, and asks once they are delivered", () => {
    const polar = leaving(5, 5);
    assert.deepEqual(tick(polar, REFRESH), []);
    polar.session.handle({ kind: "ChangePublished", data: JSON.stringify({ c: [{ k: KEY, r: 6, p: 5, s: ["u", "0"], d: [] }] }) });
    assert.deepEqual(polar.session.effects(), []);
    assert.equal(tick(polar, 2 * REFRESH).length, 1);
  });

  it("stops looking when nothing is pending, and never asks", () => {
    const polar = leaving(0, 0);
    assert.deepEqual(tick(polar, REFRESH), []);
    assert.equal(polar.session.nextDeadline(), 20); // the link's ping, and nothing of c1
  });

  it("leaves a dormant customer to its next read, and is off with null", () => {
    const polar = leaving(5, 0);
    const flow = polar.session.remote?.flows.get("external:c1");
    assert.ok(flow !== undefined && flow.refreshAt === REFRESH);
    flow.dormant = true;
    assert.deepEqual(tick(polar, REFRESH), []);
    assert.equal(flow.refreshAt, null);
    const off = leaving(5, 0, makeSettings({ refreshAfter: null }));
    assert.equal(off.session.remote?.flows.get("external:c1")?.refreshAt, null);
    for (const value of [0, -1, Infinity, NaN]) {
      assert.throws(() => makeSettings({ refreshAfter: value }), /refresh_after/);
    }
    assert.equal(makeSettings().refreshAfter, 600);
  });
});
