import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Aggregate, formatNumber, parseNumber } from "../../src/core/aggregate.js";
import { Customer, SHARDS_KEY, ackedKey, allChannels, allOutboxes, bucketKey, encodeComponent, shardOf, stateKey } from "../../src/core/keys.js";
import { iso, isoPython } from "../../src/core/time.js";

describe("numbers as lib.lua's fmt writes them (conformance/README.md §2)", () => {
  const cases: [number, string][] = [
    [0.1 + 0.2, "0.30000000000000004"],
    [1e16, "1e+16"],
    [12345678901234568, "12345678901234568"],
    [2.5e-7, "2.5e-07"],
    [9007199254740992, "9007199254740992"],
    [5e-324, "4.94065645841247e-324"],
    [-0, "0"],
    [1.5, "1.5"],
    [-1e21, "-1e+21"],
    [123456.789, "123456.789"],
    [1e-5, "1e-05"],
    [1 / 3, "0.3333333333333333"],
    [2 ** 53 - 1, "9007199254740991"],
  ];
  for (const [value, text] of cases) {
    it(`${value} → ${text}`, () => {
      assert.equal(formatNumber(value), text);
      assert.equal(parseNumber(text), value === 0 ? 0 : value);
    });
  }

  it("refuses what tonumber would not read the same", () => {
    for (const text of ["", "1.", ".5", "0x10", "inf", "nan", "1e999", " 1", "+1"]) assert.equal(parseNumber(text), null, text);
  });

  it("encodes and decodes aggregates", () => {
    assert.equal(new Aggregate().encode(), "0 0 - -");
    assert.equal(Aggregate.of([3, 0.5, 10]).encode(), "3 13.5 0.5 10");
    assert.deepEqual(Aggregate.decode("3 13.5 0.5 10"), Aggregate.of([3, 0.5, 10]));
    for (const bad of ["1 1 - -", "0 1 - -", "2 3 5 1", "x 1 1 1", "1 1 1"]) assert.equal(Aggregate.decode(bad), null, bad);
  });
});

describe("the key layout (conformance/README.md §1)", () => {
  it("shards as the README's examples", () => {
    assert.equal(shardOf(new Customer("external", "c1")), 10);
    assert.equal(shardOf(new Customer("external", "acme:{eu} 1")), 2);
    assert.equal(shardOf(new Customer("external", "c:2 {x}")), 7);
  });

  it("shards modulo the deployment's count, as the README's examples", () => {
    const examples = ["c1", "acme:{eu} 1", "c:2 {x}", "c2"].map((id) => new Customer("external", id));
    assert.deepEqual(examples.map((c) => shardOf(c)), [10, 2, 7, 0]);
    assert.deepEqual(examples.map((c) => shardOf(c, 64)), [10, 50, 7, 48]);
    assert.deepEqual(examples.map((c) => shardOf(c, 1024)), [906, 306, 839, 560]);
    assert.equal(stateKey(new Customer("external", "c2"), "r", 64), "outpost:v2:{48}:external:c2:r");
    assert.deepEqual(allOutboxes(64).slice(62), ["outpost:v2:{62}:outbox", "outpost:v2:{63}:outbox"]);
    assert.equal(allChannels("db1", 64).length, 64);
    assert.equal(SHARDS_KEY, "outpost:v2:{fleet}:shards");
  });

  it("percent-encodes what could break a key, and only that", () => {
    assert.equal(encodeComponent("acme:{eu} 1"), "acme%3A%7Beu%7D%201");
    assert.equal(encodeComponent("é\u200b😀"), "é%E2%80%8B😀");
    assert.equal(stateKey(new Customer("external", "c1"), "r-count"), "outpost:v2:{10}:external:c1:r-count");
  });

  it("keeps each bucket's events in a hash of its own, and indexes the acknowledged ones", () => {
    const state = stateKey(new Customer("external", "c1"), "r-count");
    assert.equal(bucketKey(state, 300_000_000), `${state}:ev:300000000`);
    assert.equal(bucketKey(state, "300000000"), `${state}:ev:300000000`);
    assert.equal(ackedKey(state), `${state}:acked`);
  });

  it("writes times as Polar and Python do", () => {
    assert.equal(iso(1796278427466728), "2026-12-03T06:13:47.466728Z");
    assert.equal(isoPython(1796278200000000), "2026-12-03T06:10:00+00:00");
    assert.equal(isoPython(1796278427463142), "2026-12-03T06:13:47.463142+00:00");
  });
});
