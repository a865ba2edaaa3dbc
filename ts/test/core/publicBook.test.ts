/** Poll planning and the per-process book of the public mode (tests/core/test_public_polls.py
 * and test_public_book.py have the same cases). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { UsageError } from "../../src/core/errors.js";
import { PublicBook } from "../../src/core/publicBook.js";
import { type CustomerMetersRequest, type Followed, MAX_ROWS, PROBE_SPAN_US, PollPlanner, requestCustomers, requestKind, requestParams } from "../../src/core/publicPolls.js";
import { sign } from "../../src/core/webhookSignature.js";

const S = 1_000_000;
const T0 = 1_800_000_000 * S;
const te = new TextEncoder();

const view = (customer: string, meterId = "m1", extra: Partial<Followed> = {}): Followed => ({
  customer, meterId, aggregation: "count", balance: 100, pendingEvents: 0, windowStartUs: null, ...extra,
});

describe("poll planning", () => {
  it("refuses misuse and renders requests", () => {
    assert.throws(() => new PollPlanner({ perMinute: 0 }), UsageError);
    assert.throws(() => new PollPlanner({ perMinute: 60, retryS: 0 }), UsageError);
    assert.deepEqual(requestParams({ externalCustomerIds: ["a", "b"], meterIds: ["m1"] }), [
      ["external_customer_id", "a"], ["external_customer_id", "b"], ["meter_id", "m1"], ["limit", "100"],
    ]);
  });

  it("asks for never-reported ones first, paced", () => {
    const planner = new PollPlanner({ perMinute: 60 });
    const views = [];
    for (let n = 0; n < 300; n++) for (const m of ["m1", "m2"]) views.push(view(`c${n}`, m));
    for (const v of views) planner.follow(v.customer, v.meterId, T0);
    const plan = planner.plan(T0, views);
    assert.deepEqual(plan.polls.map((r) => r.externalCustomerIds.length), [50, 50, 50, 50]);
    assert.equal(planner.plan(T0, views).polls.length, 0);
    assert.deepEqual(planner.plan(T0 + 2 * S, views).polls.map((r) => r.externalCustomerIds[0]), ["c200", "c250"]);
    assert.equal(planner.plan(T0 + 12 * S, views).polls[0]?.externalCustomerIds[0], "c0");
  });

  it("polls stale ones and probes low or busy ones", () => {
    const planner = new PollPlanner({ perMinute: 600, probeBand: 5 });
    const views = [view("low", "m1", { balance: 5 }), view("busy", "m1", { pendingEvents: 3, windowStartUs: T0 - 100 * S }),
      view("maxed", "m1", { aggregation: "max", balance: 0 }), view("gone")];
    for (const v of views.slice(0, 3)) {
      planner.follow(v.customer, v.meterId, T0);
      planner.heard(v.customer, v.meterId, T0);
    }
    const first = planner.plan(T0 + S, views);
    assert.deepEqual(first.probes, [{ customer: "low", meterId: "m1", startUs: T0 + S - PROBE_SPAN_US, endUs: T0 + S + 86_400 * S, interval: "day", kind: "external" }]);
    const later = planner.plan(T0 + 600 * S, views);
    assert.deepEqual(later.probes.map((p) => p.customer), ["low", "busy"]);
    assert.equal(later.polls.length, 1);
    planner.unfollow("low", "m1");
    assert.equal(planner.plan(T0 + 2000 * S, views).probes.length, 1);
  });

  it("asks for customers named by Polar's id by customer_id, one kind a request", () => {
    const planner = new PollPlanner({ perMinute: 600 });
    const views = [view("a"), view("u1", "m1", { kind: "customer" }), view("b"), view("u2", "m1", { kind: "customer" })];
    for (const v of views) planner.follow(v.customer, v.meterId, T0, v.kind);
    const plan = planner.plan(T0, views);
    assert.deepEqual(plan.polls, [
      { externalCustomerIds: ["a", "b"], meterIds: ["m1"] },
      { externalCustomerIds: [], meterIds: ["m1"], customerIds: ["u1", "u2"] },
    ]);
    assert.deepEqual(requestParams(plan.polls[1] as CustomerMetersRequest), [["customer_id", "u1"], ["customer_id", "u2"], ["meter_id", "m1"], ["limit", "100"]]);
    assert.equal(planner.plan(T0 + 5 * S, views).polls.length, 0); // asked, each under its kind
    planner.heard("u1", "m1", T0 + 5 * S, "customer");
    planner.heard("u1", "m1", T0 + 5 * S); // the same name as an external id: another customer
    assert.equal(planner.heardAt.size, 2);
    planner.unfollow("u1", "m1", "customer");
    assert.equal(planner.heardAt.size, 1);
    const low = view("u3", "m1", { balance: 0, kind: "customer" });
    planner.follow("u3", "m1", T0, "customer");
    planner.heard("u3", "m1", T0, "customer");
    assert.deepEqual(planner.plan(T0 + 20 * S, [low]).probes.map((p) => [p.customer, p.kind]), [["u3", "customer"]]);
  });

  it("batches within 100 rows and covers everything", () => {
    fc.assert(
      fc.property(fc.uniqueArray(fc.tuple(fc.nat(400), fc.nat(150), fc.boolean()), { minLength: 1, maxLength: 400, selector: ([c, m, k]) => `${c}:${m}:${k}` }), (pairs) => {
        const views = pairs.map(([c, m, k]) => view(`c${c}`, `m${m}`, { kind: k ? "customer" : "external" }));
        const requests = PollPlanner.batches(views);
        const covered = new Set<string>();
        for (const r of requests) {
          assert.ok(requestCustomers(r).length * r.meterIds.length <= MAX_ROWS);
          assert.ok(!(r.externalCustomerIds.length && r.customerIds?.length)); // one kind each
          for (const c of requestCustomers(r)) for (const m of r.meterIds) covered.add(`${requestKind(r)}:${c}:${m}`);
        }
        for (const v of views) assert.ok(covered.has(`${v.kind}:${v.customer}:${v.meterId}`));
      }),
      { numRuns: 100 },
    );
  });
});

const KEY = te.encode("k".repeat(24));
const SECRET = `whsec_${Buffer.from(KEY).toString("base64")}`;
const row = (consumed = 0, credited = 100) => ({ meter_id: "m1", consumed_units: consumed, credited_units: credited, balance: credited - consumed, modified_at: "2026-12-02T15:00:00Z" });

function delivery(rows: unknown[]): [Uint8Array, Record<string, string>] {
  const body = te.encode(JSON.stringify({ type: "customer.state_changed", data: { external_id: "acme", id: "u1", active_meters: rows } }));
  const at = Math.floor(T0 / S);
  return [body, { "webhook-id": "msg_1", "webhook-timestamp": String(at), "webhook-signature": sign(KEY, "msg_1", at, body) }];
}

describe("the public book", () => {
  it("routes webhooks, pages, probes and events to the followed ledgers", () => {
    const book = new PublicBook(new PollPlanner({ perMinute: 60 }), SECRET);
    book.follow("acme", "m1", "count", T0);
    book.follow("acme", "m1", "count", T0);
    book.follow("u2", "m1", "sum", T0);
    book.record("acme", "m1", "e1");
    book.record("acme", "m1", "e1");
    const [body, headers] = delivery([row(), { ...row(), meter_id: "other" }, { meter_id: 3 }]);
    assert.equal(book.handleWebhook(te.encode(" "), headers, T0).status, 401);
    const answer = book.handleWebhook(body, headers, T0);
    assert.deepEqual([answer.status, answer.outcomes], [204, [["acme", "m1", "first"]]]);
    assert.deepEqual([...book.rejections], [["webhook_signature", 1], ["webhook_row", 1]]);
    assert.equal(book.balance("acme", "m1").balance, 99);
    book.acknowledged(["e1", "unknown"], T0);
    const page = te.encode(JSON.stringify({ items: [{ ...row(4), customer_id: "u2", customer: null }] }));
    assert.deepEqual(book.handlePage(page, T0), [["u2", "m1", "first"]]);
    assert.deepEqual(book.handlePage(te.encode("junk"), T0), []);
    book.record("acme", "m1", "e2");
    book.discard(["e2"]);
    assert.equal(book.handleProbe("acme", "m1", 10, T0 + 5 * S, 0), false); // more than Polar can count
    assert.equal(book.handleProbe("acme", "m1", 1, T0 + 5 * S, 0), true);
    assert.equal(book.balance("acme", "m1").balance, 99);
    assert.equal(book.handleProbe("acme", "m1", Number.NaN, T0, 0), false);
    assert.equal(book.handleProbe("nobody", "m1", 1, T0 + 6 * S, 0), false);
    assert.equal(book.plan(T0).polls.length, 0);
    book.unfollow("acme", "m1");
    book.acknowledged(["e1"], T0);
    assert.throws(() => book.balance("acme", "m1"), UsageError);
    assert.throws(() => new PublicBook(new PollPlanner({ perMinute: 60 })).handleWebhook(body, headers, T0), UsageError);
  });
});
