/** Quantities probes (tests/core/test_public_probes.py has the same cases): the request, its
 * answer read from a hostile body, what the planner learns of a followed customer meter, and
 * what a probe's answer writes into the state hash. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { deriveState } from "../../src/core/mirror.js";
import { PUBLIC_SID, anchor } from "../../src/core/publicAnchoring.js";
import type { PolarReading } from "../../src/core/publicLedger.js";
import { DAY_US, intervalFor } from "../../src/core/publicPolls.js";
import { PROBE_LAG_US, followedOf, parseQuantities, probeAnchor, probeParams, quantitiesPath } from "../../src/core/publicProbes.js";

const SEC = 1_000_000;
const MARGIN = 10 * SEC;
const T0 = 1_800_000_000 * SEC;
const te = new TextEncoder();

function reading(consumed: number, credited: number, modifiedAtUs: number | null): PolarReading {
  return { externalCustomerId: "c1", customerId: null, meterId: "m", consumed, credited, balance: credited - consumed, modifiedAtUs };
}

describe("quantities probes", () => {
  it("asks for the window to the second, at the finest interval Polar serves over it", () => {
    assert.equal(quantitiesPath("a/b c"), "/v1/meters/a%2Fb%20c/quantities");
    assert.deepEqual(probeParams({ customer: "c1", meterId: "m", startUs: T0 + 1, endUs: T0 + DAY_US - 1, interval: "hour", kind: "external" }), [
      ["external_customer_id", "c1"],
      ["start_timestamp", "2027-01-15T08:00:00Z"],
      ["end_timestamp", "2027-01-16T08:00:00Z"],
      ["interval", "hour"],
    ]);
    assert.deepEqual(probeParams({ customer: "u1", meterId: "m", startUs: T0, endUs: T0 + DAY_US, interval: "hour", kind: "customer" })[0], ["customer_id", "u1"]);
    assert.deepEqual([7, 31, 400, 2000].map((days) => intervalFor(days * DAY_US)), ["hour", "day", "month", "year"]);
  });

  it("reads a total, and a body that is not one as a problem", () => {
    assert.deepEqual(parseQuantities(te.encode(JSON.stringify({ quantities: [], total: 2 }))), { total: 2, problem: null });
    const bodies: [Uint8Array, string][] = [
      [te.encode("{"), "quantities: not JSON"],
      [new Uint8Array([0xff]), "quantities: not JSON"],
      [te.encode("[1]"), "quantities without a numeric total"],
      [te.encode('{"total": "3"}'), "quantities without a numeric total"],
      [te.encode('{"total": -1}'), "quantities: a total of -1"],
      [te.encode('{"total": 1e999}'), "quantities: a total of Infinity"],
      [new Uint8Array(8 * 1024 * 1024 + 1), "quantities: body of"],
    ];
    for (const [body, problem] of bodies) {
      const answer = parseQuantities(body);
      assert.equal(answer.total, null);
      assert.ok(answer.problem?.startsWith(problem), answer.problem ?? "");
    }
  });

  it("tells the planner a followed customer meter's balance, pending events and window start", () => {
    const first = anchor("count", MARGIN, {}, {}, reading(3, 10, T0));
    assert.ok(first.write !== null);
    const pub = JSON.stringify({ ...(JSON.parse(first.write.pub) as object), h: T0 - 5 });
    const fields = new Map([["sid", PUBLIC_SID], ["cu", "0"], ["p", first.write.polar], ["c:m", "10"], ["a:1", "2 2 1 1"], ["n", "2"]]);
    const state = deriveState(fields);
    const view = followedOf("c1", "m", "count", state, pub);
    assert.equal(followedOf("u1", "m", "count", state, pub, "customer").kind, "customer");
    assert.deepEqual([view.balance, view.pendingEvents, view.windowStartUs], [5, 2, T0 - 5]);
    assert.equal(followedOf("c1", "m", "max", state, pub).balance, null);
    assert.equal(followedOf("c1", "m", "count", deriveState(new Map()), undefined).balance, null);
    for (const bad of ["{", '{"h": true}', "[]"]) assert.equal(followedOf("c1", "m", "count", state, bad).windowStartUs, null);
  });

  it("re-anchors consumed on a probe's answer, with the anchor's credits and modified_at", () => {
    const events = { "1:e1": `2 ${T0 + 100 * SEC}`, "1:e2": `1 ${T0 + 195 * SEC}`, "1:e3": "4" };
    const first = anchor("sum", MARGIN, {}, events, reading(3, 10, T0));
    assert.ok(first.write !== null);
    const fields = { rev: "4", sid: PUBLIC_SID, pub: first.write.pub };
    const decided = probeAnchor("sum", MARGIN, fields, events, "m", 5, T0 + 200 * SEC);
    assert.equal(decided.outcome, "probed");
    const write = decided.write;
    assert.ok(write !== null);
    assert.deepEqual([write.expectedRev, write.credited, write.asOf, write.polar, write.removed], ["4", "10", String(T0), "1 5 5 5", ["1:e1"]]);
    assert.deepEqual((JSON.parse(write.pub) as { q: unknown }).q, [5, T0 + 200 * SEC, PROBE_LAG_US]);
    const rest = { "1:e2": events["1:e2"], "1:e3": events["1:e3"] };
    const again = anchor("sum", MARGIN, { ...fields, rev: "5", pub: write.pub }, rest, reading(4, 12, T0 + 199 * SEC));
    assert.equal(again.write?.polar, "1 5 5 5");
  });

  it("writes nothing for a probe it cannot use", () => {
    const first = anchor("count", MARGIN, {}, {}, reading(3, 10, T0));
    assert.ok(first.write !== null);
    const fields = { rev: "1", sid: PUBLIC_SID, pub: first.write.pub };
    const low = probeAnchor("count", MARGIN, fields, {}, "m", 2, T0 + 100 * SEC);
    assert.deepEqual([low.outcome, low.write], ["probe_unused", null]);
    assert.equal(probeAnchor("count", MARGIN, { ...fields, sid: "snap-1" }, {}, "m", 3, T0 + 100 * SEC).write, null);
    assert.equal(probeAnchor("count", MARGIN, {}, {}, "m", 3, T0).write, null);
  });
});
