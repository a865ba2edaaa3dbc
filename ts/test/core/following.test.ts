/** Following a bounded number of customers (outpost_core/_following.py, tests/core/test_following.py):
 * letting go of the least recently read and the idle ones, telling Polar to forget them, a re-read
 * after that, deadlines in a heap, and paced requests after a reconnect. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Deadlines } from "../../src/core/deadlines.js";
import type { Effect } from "../../src/core/effects.js";
import { Following, Pacer } from "../../src/core/following.js";
import { stateKey, Customer } from "../../src/core/keys.js";
import { Link, Target } from "../../src/core/link.js";
import { type Settings, Session, makeSettings } from "../../src/core/session.js";
import type { Balance } from "../../src/core/balance.js";
import { replayBytes } from "../../src/core/trace.js";
import { acceptFor, decodeClientFrames } from "../../src/core/websocket.js";

const te = new TextEncoder();
const CONFIGURATION = {
  organization_id: "org",
  reducers: [{ id: "r-count", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "count" }, meter_ids: ["m-count"] }],
};
const FIELDS = { rev: "3", cu: "600000000", sa: "600000001", sid: "s-0", p: "2 2 1 1", "c:m-count": "10" };

function frame(message: unknown): Uint8Array {
  const payload = te.encode(JSON.stringify(message));
  const head = payload.length < 126 ? [0x81, payload.length] : [0x81, 126, payload.length >> 8, payload.length & 0xff];
  return Uint8Array.from([...head, ...payload]);
}

function sent(effects: Effect[]): any[] {
  return effects.flatMap((e) => (e.kind === "SendBytes" ? decodeClientFrames(e.data).filter(([op]) => op === "TEXT").map(([, text]) => JSON.parse(text as string)) : []));
}

const key = (name: string) => stateKey(new Customer("external", name), "r-count");

class Polar {
  readonly session: Session;
  now = 0;
  /** Every message the client sent, in order. */
  messages: any[] = [];

  constructor(settings: Partial<Settings> = {}) {
    this.session = new Session(makeSettings(settings), new Link(Target.of("http://polar"), "t", { random: () => 0.5 }, replayBytes(), { pingInterval: 1e9, deadAfter: 1e9 }));
    this.session.handle({ kind: "SubscriberRestarted" });
    this.open();
    this.push(frame({ type: "configuration", payload: CONFIGURATION }));
    this.effects();
  }

  open(): void {
    this.session.handle({ kind: "Tick", now: this.now, wallUs: 1_000 });
    assert.equal(this.session.effects()[0]?.kind, "OpenConnection");
    this.session.handle({ kind: "ConnectionOpened", now: this.now });
    const [upgrade] = this.session.effects();
    const request = Buffer.from((upgrade as { data: Uint8Array }).data).toString("latin1");
    const wsKey = /sec-websocket-key: (\S+)/.exec(request)?.[1] as string;
    this.push(te.encode(`HTTP/1.1 101 S\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${acceptFor(wsKey)}\r\n\r\n`));
  }

  push(data: Uint8Array): void {
    this.session.handle({ kind: "BytesReceived", now: this.now, data });
  }

  /** Run the effects: messages recorded, loads answered with FIELDS; the rest returned. */
  effects(): Effect[] {
    const rest: Effect[] = [];
    for (const effect of this.session.effects()) {
      if (effect.kind === "SendBytes") this.messages.push(...sent([effect]));
      else if (effect.kind === "LoadIdentity") this.session.handle({ kind: "IdentityLoaded", key: effect.key, fields: FIELDS, loadId: effect.loadId });
      else rest.push(effect);
    }
    return rest;
  }

  take(): any[] {
    this.effects();
    const out = this.messages;
    this.messages = [];
    return out;
  }

  tick(now: number): void {
    this.now = now;
    this.session.handle({ kind: "Tick", now, wallUs: 1_000 });
    this.effects();
  }

  /** A first read: the load, Polar's snapshot applied, the balance. */
  firstRead(name: string): void {
    assert.equal(this.session.read("m-count", name), null);
    const [request] = this.take().filter((m) => m.type === "snapshot");
    const payload = { snapshot_id: "s-1", request_id: request.payload.request_id, external_customer_id: name, as_of: 600_000_001, cold_until: 600_000_000, reducers: { "r-count": { count: 2, sum: 2, min: 1, max: 1 } }, credited: { "m-count": 10 } };
    this.push(frame({ type: "snapshot", payload }));
    const [list] = this.effects();
    this.session.handle({ kind: "PendingListed", tag: (list as { tag: number }).tag, fields: {} });
    const [apply] = this.effects();
    const reply = JSON.stringify({ c: [{ k: key(name), r: 4, s: ["sid", "s-1"], d: [] }] });
    this.session.handle({ kind: "ScriptReplied", reply, tag: (apply as { tag: number }).tag });
    assert.equal((this.session.read("m-count", name) as Balance).balance, 8);
  }

  followed(): string[] {
    return this.session.followed.map((m) => m.customer.id).sort();
  }
}

describe("following a bounded number of customers", () => {
  it("checks its settings", () => {
    assert.throws(() => makeSettings({ maxCustomers: 0 }), /max_customers/);
    assert.throws(() => makeSettings({ maxCustomers: 1.5 }), /max_customers/);
    assert.throws(() => makeSettings({ idleCustomerTtl: 0 }), /idle_customer_ttl/);
  });

  it("lets go of the least recently read customer and tells Polar to forget it", () => {
    const polar = new Polar({ maxCustomers: 2 });
    polar.firstRead("a");
    polar.firstRead("b");
    assert.ok(polar.session.read("m-count", "a"));
    polar.firstRead("c");
    assert.deepEqual(polar.followed(), ["a", "c"]);
    assert.equal(polar.session.cachedBalance("m-count", "b", null), null);
  });

  it("sends forget, and reads a customer let go again from Redis at once", () => {
    const polar = new Polar({ maxCustomers: 1 });
    polar.firstRead("a");
    polar.firstRead("b");
    assert.deepEqual(polar.take(), []);
    assert.equal(polar.session.read("m-count", "a"), null); // its load
    assert.deepEqual(polar.take().map((m) => [m.type, m.payload.external_customer_id]), [["snapshot", "a"], ["forget", "b"]]);
    assert.equal((polar.session.read("m-count", "a") as Balance).balance, 8); // no wait for Polar
  });

  it("keeps a customer whose read waits, and one kept busy by warm reads", () => {
    const polar = new Polar({ maxCustomers: 1 });
    assert.equal(polar.session.read("m-count", "a"), null);
    assert.equal(polar.session.read("m-count", "b"), null);
    assert.deepEqual(polar.followed(), ["a", "b"]);
    const warm = new Polar({ maxCustomers: 2 });
    warm.firstRead("a");
    warm.firstRead("b");
    assert.ok(warm.session.cachedBalance("m-count", "a", null));
    warm.firstRead("c");
    assert.deepEqual(warm.followed(), ["a", "c"]);
  });

  it("lets go of idle customers on time", () => {
    const polar = new Polar({ idleCustomerTtl: 100 });
    polar.firstRead("a");
    polar.tick(50);
    assert.equal(polar.session.nextDeadline(), 150);
    polar.tick(149);
    assert.deepEqual(polar.followed(), ["a"]);
    polar.tick(150);
    assert.deepEqual(polar.followed(), []);
    assert.equal(polar.take().at(-1).type, "forget");
  });

  it("asks again after a reconnect only for recent customers, at the pace", () => {
    const polar = new Polar({ recentWindow: 30, reloadRate: 2 });
    polar.firstRead("old");
    polar.tick(0);
    polar.tick(60);
    for (const name of ["r1", "r2", "r3"]) polar.firstRead(name);
    polar.tick(61);
    polar.session.handle({ kind: "ConnectionFailed", now: 61, reason: "reset" });
    polar.effects();
    polar.now = 62; // past the reconnect backoff
    polar.open();
    const asked = () => polar.take().filter((m) => m.type === "snapshot").map((m) => m.payload.external_customer_id);
    assert.deepEqual(asked(), ["r3", "r2"]);
    assert.equal(polar.session.nextDeadline(), 62.5);
    polar.tick(62.5);
    assert.deepEqual(asked(), ["r1"]);
    polar.tick(70);
    assert.deepEqual(asked(), []);
    assert.ok(polar.session.read("m-count", "old"));
    assert.deepEqual(asked(), ["old"]);
  });

  it("reloads only recent copies after a restarted subscription, at the pace", () => {
    const polar = new Polar({ recentWindow: 30, reloadRate: 1 });
    polar.firstRead("old");
    polar.tick(0);
    polar.tick(60);
    polar.firstRead("r1");
    polar.firstRead("r2");
    polar.tick(61);
    polar.session.handle({ kind: "SubscriberRestarted" });
    const loads = () => polar.session.effects().filter((e) => e.kind === "LoadIdentity").map((e) => (e as { key: string }).key);
    assert.deepEqual(loads(), [key("r2")]);
    polar.session.handle({ kind: "Tick", now: 62, wallUs: 1_000 });
    assert.deepEqual(loads(), [key("r1")]);
    const fetch = polar.session.read("m-count", "old");
    assert.deepEqual(fetch, { kind: "Fetch", keys: [key("old")] });
    assert.deepEqual(loads(), [key("old")]);
  });

  it("keeps deadlines in a heap and paces bulk work", () => {
    const deadlines = new Deadlines<string>();
    deadlines.set("a", 2);
    deadlines.set("a", 2);
    deadlines.set("b", 1);
    deadlines.set("b", null);
    deadlines.cancel("nothing");
    assert.equal(deadlines.size, 1);
    assert.equal(deadlines.get("a"), 2);
    assert.equal(deadlines.next(), 2);
    for (let i = 0; i < 200; i++) deadlines.set("a", 3 + i);
    assert.deepEqual(deadlines.popDue(10), []);
    assert.deepEqual(deadlines.popDue(1000), ["a"]);
    assert.equal(deadlines.next(), null);
    const following = new Following<string>();
    assert.equal(following.oldest(), null);
    following.add("a", "a", 1);
    following.waiting("a", 1);
    assert.ok(following.pinned("a", 100));
    following.stamp(10);
    assert.ok(following.pinned("a", 10.5) && !following.pinned("a", 11));
    assert.ok(following.has("a"));
    const pacer = new Pacer(2);
    assert.equal(pacer.nextAt(0), 0);
    assert.equal(pacer.take(0, 5), 2);
    assert.equal(pacer.nextAt(0), 0.5);
    assert.equal(pacer.take(10, 5), 2);
    const slow = new Pacer(0.5); // slower than one a second: one at a time, every two seconds
    assert.equal(slow.take(0, 5), 1);
    assert.equal(slow.nextAt(0), 2);
    assert.equal(slow.take(1, 5), 0);
    assert.equal(slow.take(2, 5), 1);
  });
});
