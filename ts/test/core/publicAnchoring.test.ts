/** The public mode written into the state hash (tests/core/test_public_anchoring.py has the same
 * cases): configuration, the mode's choice, the ledger's persistent part, and what
 * apply_anchor.lua is asked to write. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { computeBalance } from "../../src/core/balance.js";
import { parseConfiguration } from "../../src/core/configuration.js";
import { Customer } from "../../src/core/keys.js";
import { deriveState } from "../../src/core/mirror.js";
import { UsageError } from "../../src/core/errors.js";
import {
  PUBLIC_SID,
  anchor,
  cachedMode,
  checkMode,
  chooseMode,
  customerOfReading,
  decodePub,
  encodePub,
  isAnchored,
  ledgerOf,
  missingRows,
  modeConflict,
  noRow,
  parseMetersPage,
  polarAggregate,
  publicConfiguration,
  reducerId,
  urgentRequests,
} from "../../src/core/publicAnchoring.js";
import { MeterLedger, type PolarReading } from "../../src/core/publicLedger.js";

const SEC = 1_000_000;
const MARGIN = 10 * SEC;
const T0 = 1_800_000_000 * SEC;

function reading(consumed: number, credited: number, modifiedAtUs: number | null, meterId = "m"): PolarReading {
  return { externalCustomerId: "c1", customerId: null, meterId, consumed, credited, balance: credited - consumed, modifiedAtUs };
}

function meter(id: string, func = "count"): Record<string, unknown> {
  return { id, name: id, filter: { conjunction: "and", clauses: [] }, aggregation: func === "count" ? { func } : { func, property: "n" } };
}

const bytes = (text: string): Uint8Array => new TextEncoder().encode(text);

describe("the public mode's configuration", () => {
  it("comes from the meters pages, one reducer per meter, sorted", () => {
    const body = bytes(JSON.stringify({ items: [meter("b", "sum"), meter("a"), { name: "no id" }, 3], pagination: { max_page: 2 } }));
    const page = parseMetersPage(body);
    assert.deepEqual(page.meters.map((m) => m.id), ["b", "a"]);
    assert.equal(page.maxPage, 2);
    assert.deepEqual(page.problems, ["a meter without an id", "a meter without an id"]);
    const payload = publicConfiguration(page.meters);
    assert.equal(payload.mode, "public");
    assert.deepEqual((payload.reducers as { id: string }[]).map((r) => r.id), ["a", "b"]);
    const configuration = parseConfiguration(payload);
    assert.notEqual(configuration.reducerFor("b"), null);
    assert.deepEqual([...configuration.meterReducers], [["a", reducerId("a")], ["b", "b"]]);
    assert.equal(cachedMode(JSON.stringify(payload)), "public");
    // Python's json.dumps of the same payload, compact: the same text in every SDK
    assert.equal(JSON.stringify(publicConfiguration([{ id: "m" }])), '{"mode":"public","reducers":[{"id":"m","filter":null,"aggregation":null,"meter_ids":["m"]}]}');
  });

  for (const body of ["{", "[]", '{"items": 1}']) {
    it(`a meters page that is not one: ${body}`, () => {
      const page = parseMetersPage(bytes(body));
      assert.deepEqual([page.meters, page.maxPage, page.problems.length], [[], 0, 1]);
    });
  }

  it("a page without pagination is the last", () => {
    assert.equal(parseMetersPage('{"items": [], "pagination": {"max_page": true}}').maxPage, 1);
    assert.equal(parseMetersPage('{"items": []}').maxPage, 1);
  });

  it("says the mode a cached configuration was built for", () => {
    assert.equal(cachedMode('{"reducers": []}'), "snapshots");
    assert.equal(cachedMode(bytes("{")), null);
    assert.equal(cachedMode("[1]"), null);
  });
});

describe("the mode", () => {
  it("is chosen from what was asked, Polar's answer and the cache", () => {
    assert.equal(chooseMode("public", 101, null)[0], "public");
    assert.equal(chooseMode("snapshots", 404, "public")[0], "snapshots");
    const [mode, reason] = chooseMode("auto", 404, null);
    assert.equal(mode, "public");
    assert.match(reason, /404/);
    assert.equal(chooseMode("auto", 101, null)[0], "snapshots");
    assert.equal(chooseMode("auto", 401, "public")[0], "snapshots"); // a refused token: it is served
    const [cached, why] = chooseMode("auto", null, "public");
    assert.equal(cached, "public");
    assert.match(why, /cached/);
    assert.equal(chooseMode("auto", null, null)[0], "snapshots");
    assert.throws(() => chooseMode("other" as "auto", null, null), UsageError);
    assert.throws(() => checkMode(3), UsageError);
    assert.equal(checkMode("auto"), "auto");
  });

  it("conflicts with another mode's cached configuration", () => {
    assert.equal(modeConflict("public", null), null);
    assert.equal(modeConflict("public", "public"), null);
    assert.match(modeConflict("public", "snapshots") ?? "", /snapshots mode/);
  });
});

describe("the ledger's persistent part", () => {
  it("round-trips", () => {
    const ledger = new MeterLedger("sum", MARGIN);
    ledger.entries.set("1:e1", { value: 2, key: null, ackedAtUs: 5 });
    ledger.anchor = reading(3, 10, T0);
    ledger.baseline = 3;
    ledger.resetHintUs = T0 - 5;
    ledger.rejections = 2;
    ledger.probe = { consumed: 4.5, sentAtUs: T0 + 1, lagUs: 7 };
    ledger.carried.add("1:e1");
    ledger.cap = 2.5;
    const text = encodePub(ledger);
    assert.equal(text, `{"v":1,"a":[3,10,7,${T0}],"b":3,"h":${T0 - 5},"r":2,"q":[4.5,${T0 + 1},7],"k":["1:e1"],"u":2.5}`);
    const problems: string[] = [];
    const again = ledgerOf("sum", MARGIN, { pub: text }, { "1:e1": "2 5" }, problems);
    assert.deepEqual(problems, []);
    assert.deepEqual([again.anchor?.consumed, again.anchor?.credited, again.anchor?.modifiedAtUs], [3, 10, T0]);
    assert.deepEqual([again.baseline, again.resetHintUs, again.rejections], [3, T0 - 5, 2]);
    assert.deepEqual(again.probe, { consumed: 4.5, sentAtUs: T0 + 1, lagUs: 7 });
    assert.deepEqual([...again.carried], ["1:e1"]);
    assert.equal(again.cap, 2.5);
    assert.equal(encodePub(again), text);
  });

  it("round-trips empty", () => {
    const again = new MeterLedger("count", MARGIN);
    const text = encodePub(new MeterLedger("count", MARGIN));
    assert.ok(!text.includes('"u"')); // written only when a cap holds
    decodePub(text, again, []);
    assert.deepEqual([again.anchor, again.probe, again.cap], [null, null, null]);
    decodePub(undefined, again, []);
  });

  it("never takes a cap from Redis that would lift the balance above Polar's", () => {
    const anchor = `"a":[10,100,90,${T0}]`;
    const events = { "1:e1": "2 5", "1:e2": "3" }; // e1 acknowledged, e2 in flight
    const problems: string[] = [];
    const low = ledgerOf("count", MARGIN, { pub: `{"v":1,${anchor},"u":-1e300}` }, events, problems);
    assert.equal(low.cap, 8); // Polar's 10 less the acknowledged e1
    assert.deepEqual(problems, ["pub: a cap below Polar's consumed less the acknowledged events"]);
    assert.equal(low.balance().balance, 100 - 8 - 5);
    assert.equal(ledgerOf("count", MARGIN, { pub: `{"v":1,${anchor},"u":9}` }, events, problems).cap, 9);
    assert.equal(problems.length, 1);
    for (const odd of ['"x"', "true", "null", "1e999"]) {
      assert.equal(ledgerOf("count", MARGIN, { pub: `{"v":1,${anchor},"u":${odd}}` }, events, problems).cap, null);
    }
    assert.equal(ledgerOf("count", MARGIN, { pub: '{"v":1,"u":3}' }, events, problems).cap, null);
  });

  const unreadable: [string, string][] = [
    ["{", "pub: "],
    ["[]", "pub: not a version 1 object"],
    ['{"v": 2}', "pub: not a version 1 object"],
    ['{"v": 1, "a": [1, 2, "x", null]}', "pub: an unreadable anchor"],
    ['{"v": 1, "a": [1, 2, 3, "x"]}', "pub: an unreadable anchor"],
    ['{"v": 1, "a": "x"}', "pub: an unreadable anchor"],
  ];
  for (const [text, problem] of unreadable) {
    it(`unreadable is a problem, never an error: ${text}`, () => {
      const problems: string[] = [];
      const ledger = new MeterLedger("sum", MARGIN);
      decodePub(text, ledger, problems);
      assert.equal(ledger.anchor, null);
      assert.ok((problems[0] ?? "").startsWith(problem));
    });
  }

  it("reads odd fields as nothing", () => {
    const ledger = new MeterLedger("sum", MARGIN);
    decodePub('{"v": 1, "a": null, "b": "x", "h": 1.5, "r": true, "q": [1, "x", 2], "k": "x"}', ledger, []);
    assert.deepEqual([ledger.baseline, ledger.resetHintUs, ledger.rejections, ledger.probe, ledger.carried.size], [0, null, 0, null, 0]);
    decodePub('{"v": 1, "q": 3, "k": [1, "gone"]}', ledger, []);
    assert.deepEqual([ledger.probe, ledger.carried.size], [null, 0]); // carried only what is pending
  });

  it("leaves unreadable events out of the ledger", () => {
    const problems: string[] = [];
    const ledger = ledgerOf("sum", MARGIN, {}, { "1:a": "x", "1:b": "1 2 3", "1:c": "inf", "1:d": "1 x", "1:e": "-4", "1:f": "2 9", "1:g": "1 99999999999999999999" }, problems);
    assert.deepEqual([...ledger.entries.keys()].sort(), ["1:e", "1:f"]);
    assert.equal(ledger.entries.get("1:e")?.value, 0);
    assert.equal(ledger.entries.get("1:f")?.ackedAtUs, 9);
    assert.equal(problems.length, 5);
  });
});

describe("anchoring", () => {
  it("writes Polar's consumed as the aggregate the reducer reads", () => {
    assert.equal(polarAggregate("count", 0), "0 0 - -");
    assert.equal(polarAggregate("count", 3), "3 3 3 3");
    assert.equal(polarAggregate("count", 2.5), "3 2.5 2.5 2.5");
    assert.equal(polarAggregate("sum", 7.5), "1 7.5 7.5 7.5");
    assert.equal(polarAggregate("max", 9), "1 9 9 9");
  });

  it("anchors nothing at first", () => {
    const decided = anchor("count", MARGIN, {}, {}, noRow("c1", null, "m"));
    assert.equal(decided.outcome, "no_watermark");
    const write = decided.write;
    assert.ok(write !== null);
    assert.deepEqual([write.expectedRev, write.asOf, write.removed], ["", "0", []]);
    assert.deepEqual(write.args("chan", -1), ["chan", "", "-1", "m", "0", "0 0 - -", "0", "0", PUBLIC_SID, write.pub, "0"]);
  });

  it("prunes what the figure includes", () => {
    const events = { "1:e1": `5 ${T0 - 30 * SEC}`, "1:e2": `3 ${T0 - 20 * SEC}`, "1:e3": "4" };
    const decided = anchor("sum", MARGIN, { rev: "7" }, events, reading(8, 50, T0));
    assert.equal(decided.outcome, "first");
    assert.deepEqual(decided.write?.removed, ["1:e1", "1:e2"]);
    assert.deepEqual([decided.write?.expectedRev, decided.write?.polar], ["7", "1 8 8 8"]);
    const pub = JSON.parse(decided.write?.pub ?? "") as { a: unknown; b: unknown };
    assert.deepEqual([pub.a, pub.b], [[8, 50, 42, T0], 8]);
  });

  it("checks a second figure from the baseline; a stale one writes nothing", () => {
    const first = anchor("sum", MARGIN, {}, { "1:e1": `5 ${T0 - 30 * SEC}` }, reading(5, 50, T0));
    const fields = { rev: "2", pub: first.write?.pub ?? "" };
    const events = { "1:e2": `3 ${T0 + 5 * SEC}` };
    const decided = anchor("sum", MARGIN, fields, events, reading(6, 50, T0 + 60 * SEC)); // rose by 1 only
    assert.deepEqual([decided.outcome, decided.rejections, decided.write?.removed], ["rejected", 1, []]);
    const stale = anchor("sum", MARGIN, fields, events, reading(9, 50, T0));
    assert.deepEqual([stale.outcome, stale.write], ["stale", null]);
  });

  it("relayed meters drop what the figure should include", () => {
    const events = { "1:e1": `5 ${T0 - 30 * SEC}`, "1:e2": "3", "1:e3": `3 ${T0}` };
    assert.deepEqual(anchor("avg", MARGIN, {}, events, reading(4, 0, T0)).write?.removed, ["1:e1"]);
    assert.deepEqual(anchor("min", MARGIN, {}, events, reading(4, 0, null)).write?.removed, []);
  });

  it("refuses unique meters, and aggregations it does not know", () => {
    assert.throws(() => anchor("unique", MARGIN, {}, {}, reading(0, 0, null)), UsageError);
    assert.throws(() => anchor("median", MARGIN, {}, {}, reading(0, 0, null)), UsageError);
  });

  it("tells an anchored state hash", () => {
    assert.ok(isAnchored({ sid: "public", cu: "0" }));
    assert.ok(!isAnchored({ sid: "s-1", cu: "5" }));
    assert.ok(!isAnchored({ sid: "public" }));
  });
});

describe("the first reads' requests", () => {
  it("name as many customers as keep each within a page", () => {
    assert.deepEqual(urgentRequests(["a", "b", "c"], 40), [
      { externalCustomerIds: ["a", "b"], meterIds: [] },
      { externalCustomerIds: ["c"], meterIds: [] },
    ]);
    assert.equal(urgentRequests(["a", "b"], 500).length, 2); // one customer each, at least
    assert.equal(urgentRequests(["a", "b"], 0).length, 1);
  });

  it("say which rows Polar has none of", () => {
    const asked = new Map([["c1", ["m", "n"]], ["c2", ["m"]]]);
    assert.deepEqual(missingRows(asked, [reading(1, 1, T0, "m")]), [["c1", "n"], ["c2", "m"]]);
  });

  it("name customers by Polar's id, in one spelling", () => {
    assert.deepEqual(urgentRequests(["u1", "u2"], 3, "customer"), [{ externalCustomerIds: [], meterIds: [], customerIds: ["u1", "u2"] }]);
    const uid = "0b1d7c3e-8d2a-4a61-9a4e-6f1f2f8a7c10";
    const row: PolarReading = { ...reading(1, 1, T0, "m1"), externalCustomerId: null, customerId: uid.toUpperCase() };
    assert.equal(customerOfReading(row, "customer"), uid);
    assert.equal(customerOfReading({ ...row, customerId: "odd" }, "customer"), "odd");
    assert.equal(customerOfReading(row, "external"), null);
    assert.deepEqual(missingRows(new Map([[uid, ["m1"]], ["u2", ["m1"]]]), [row], "customer"), [["u2", "m1"]]);
  });

  it("marks the balance of an avg or min meter of the public mode approximate", () => {
    const cases: [string, string, boolean][] = [["avg", PUBLIC_SID, true], ["min", PUBLIC_SID, true], ["count", PUBLIC_SID, false], ["sum", PUBLIC_SID, false], ["max", PUBLIC_SID, false], ["avg", "snap-1", false]];
    for (const [func, sid, approximate] of cases) {
      const decided = anchor(func, MARGIN, {}, {}, reading(4, 10, T0));
      assert.ok(decided.write !== null);
      const fields = new Map([["p", decided.write.polar], ["c:m", "10"], ["cu", "0"], ["sid", sid], ["rev", "1"]]);
      const balance = computeBalance("m", new Customer("external", "c1"), func, deriveState(fields));
      assert.deepEqual([balance.balance, balance.approximate, balance.fromRedis().approximate], [6, approximate, approximate]);
    }
  });
});
