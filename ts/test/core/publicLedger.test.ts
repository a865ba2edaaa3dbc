/** The public-mode ledger (tests/core/test_public_ledger.py has the same cases): it drops an
 * event only when Polar's figure provably includes it, and never reads above Polar's balance,
 * nor above the true one, against a model of Polar with late, lost and reordered readings. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { UsageError } from "../../src/core/errors.js";
import { MeterLedger, type PolarReading } from "../../src/core/publicLedger.js";

const S = 1_000_000;
const MARGIN = 60 * S;

function reading(consumed: number, credited: number, atS: number | null): PolarReading {
  return {
    externalCustomerId: "c1",
    customerId: null,
    meterId: "m1",
    consumed,
    credited,
    balance: credited - consumed,
    modifiedAtUs: atS === null ? null : atS * S,
  };
}

/** A count ledger anchored on a reading of `consumed` of 100 credited (at `atS`), then event e1
 * recorded and acknowledged at 1001 s. */
function oneAcknowledged(consumed: number, atS: number | null = 1000): MeterLedger {
  const book = new MeterLedger("count", MARGIN);
  book.observe(reading(consumed, 100, atS));
  book.record("e1");
  book.acknowledged(["e1"], 1001 * S);
  return book;
}

describe("the public-mode ledger", () => {
  it("refuses misuse", () => {
    assert.throws(() => new MeterLedger("median"), UsageError);
    assert.throws(() => new MeterLedger("sum", -1), UsageError);
    assert.throws(() => new MeterLedger("unique").record("e1"), UsageError);
  });

  it("keeps events until Polar provably includes them", () => {
    const book = new MeterLedger("sum", MARGIN);
    assert.equal(book.balance().balance, null);
    assert.equal(book.observe(reading(0, 100, 1000)), "first");
    book.record("e1", 5);
    book.record("e1", 5);
    book.record("e2", -4);
    assert.equal(book.balance().balance, 95);
    book.acknowledged(["e1", "e2", "unknown"], 1010 * S);
    assert.equal(book.observe(reading(5, 100, 1060)), "accepted");
    assert.equal(book.entries.size, 2); // not provably included: they stay
    // Polar's consumed rose by 5 and only the ledger's e1 can make it up: not counted twice.
    assert.equal(book.balance().balance, 95);
    assert.equal(book.observe(reading(5, 100, 1071)), "accepted");
    assert.equal(book.balance().balance, 95);
    assert.equal(book.entries.size, 0);
    assert.equal(book.observe(reading(5, 100, 1071)), "stale");
  });

  it("does not count twice the fresh events a grant's recompute counts", () => {
    const book = new MeterLedger("count", MARGIN);
    book.observe(reading(0, 2, 1000));
    book.record("e1");
    book.record("e2");
    book.acknowledged(["e1", "e2"], 1001 * S);
    assert.equal(book.balance().balance, 0);
    assert.equal(book.observe(reading(2, 3, 1002)), "accepted");
    assert.equal(book.entries.size, 2);
    assert.equal(book.cap, 0);
    assert.equal(book.balance().balance, 1);
    book.record("e3");
    assert.equal(book.balance().balance, 0);
    book.acknowledged(["e3"], 1003 * S);
    assert.equal(book.observe(reading(3, 3, 1100)), "accepted");
    assert.equal(book.entries.size, 0);
    assert.equal(book.cap, 3);
    assert.equal(book.balance().balance, 0);
  });

  it("never lifts the balance above Polar's with the cap", () => {
    const book = oneAcknowledged(0);
    book.record("e2");
    assert.equal(book.observe(reading(10, 100, 1002)), "accepted"); // 9 units from elsewhere
    assert.equal(book.cap, 9);
    assert.equal(book.balance().balance, 100 - 10 - 1);
    book.acknowledged(["e2"], 1003 * S);
    assert.equal(book.balance().balance, 89);
  });

  it("has no cap after a reset, for a max meter, or after a reading without a watermark", () => {
    const book = oneAcknowledged(5);
    assert.equal(book.observe(reading(6, 100, 1002)), "accepted");
    assert.equal(book.cap, 5);
    assert.equal(book.observe(reading(0, 100, 1003)), "reset");
    assert.equal(book.cap, null);
    const highest = new MeterLedger("max", MARGIN);
    highest.observe(reading(5, 100, 1000));
    highest.record("e1", 7);
    highest.acknowledged(["e1"], 1001 * S);
    assert.equal(highest.observe(reading(7, 100, 1002)), "accepted");
    assert.equal(highest.cap, null);
    const first = oneAcknowledged(0, null);
    assert.equal(first.observe(reading(1, 100, 1002)), "accepted");
    assert.equal(first.cap, null);
    assert.equal(first.balance().balance, 98);
  });

  it("rejects an activation that moves modifiedAt without the events", () => {
    const book = new MeterLedger("count", MARGIN);
    assert.equal(book.observe(reading(0, 10, null)), "no_watermark");
    book.record("e1");
    book.acknowledged(["e1"], 1000 * S);
    assert.equal(book.observe(reading(0, 10, 2000)), "rejected");
    assert.equal(book.balance().balance, 9);
    assert.equal(book.observe(reading(1, 10, 2015)), "accepted");
    assert.equal(book.observe(reading(1, 10, null)), "stale");
  });

  it("drops what came before a reset, carries what it cannot place", () => {
    const book = new MeterLedger("count", MARGIN);
    book.observe(reading(0, 100, 1000));
    for (const id of ["old0", "old1", "old2"]) book.record(id);
    book.acknowledged(["old0", "old1"], 1100 * S);
    book.acknowledged(["old2"], 1990 * S);
    book.observe(reading(2, 100, 2000));
    book.record("new");
    book.acknowledged(["new"], 3000 * S);
    assert.equal(book.observe(reading(0, 50, 3100)), "reset");
    assert.deepEqual([...book.carried].sort(), ["new", "old2"]);
    assert.equal(book.balance().balance, 48);
    book.resetSeen(5000 * S); // a cycle known between the anchor and the next reading
    assert.equal(book.observe(reading(0, 40, 9000)), "reset");
    assert.equal(book.observe(reading(-1, 40, 9100)), "reset");
    assert.equal(book.entries.size, 0);
    book.record("x");
    book.discard(["x"]);
    assert.equal(book.balance().pending, 0);
  });

  it("handles max, unique, relayed meters and probes", () => {
    const max = new MeterLedger("max", MARGIN);
    max.observe(reading(4, 10, 1000));
    max.record("a", 9);
    max.acknowledged(["a"], 1100 * S);
    assert.equal(max.balance().balance, 1);
    assert.equal(max.observe(reading(5, 10, 1200)), "rejected");
    assert.equal(max.observe(reading(9, 10, 1300)), "accepted");
    const unique = new MeterLedger("unique", MARGIN);
    unique.observe(reading(2, 10, 1000));
    unique.record("a", 1, "x");
    unique.record("b", 1, "x");
    assert.equal(unique.balance().balance, 7);
    const avg = new MeterLedger("avg", MARGIN);
    avg.observe(reading(4, 10, 1000));
    avg.record("a", 100);
    assert.deepEqual(avg.balance(), { balance: 6, approximate: true, polarBalance: 6, pending: 0, anchoredAtUs: 1000 * S });
  });

  it("leaves a probe it cannot use aside", () => {
    const book = new MeterLedger("count", MARGIN);
    assert.equal(book.observeProbe(5, 1000 * S, 5 * S), "probe_unused"); // no anchor yet
    book.observe(reading(4, 100, 1000));
    book.record("e1");
    book.acknowledged(["e1"], 1010 * S);
    assert.equal(book.observeProbe(5, 945 * S, 5 * S), "probe_unused"); // not newer than the anchor
    assert.equal(book.observeProbe(3, 1100 * S, 5 * S), "probe_unused"); // below the anchor's
    assert.equal(book.observeProbe(6, 1100 * S, 5 * S), "probe_unused"); // beyond what Outpost holds
    assert.deepEqual([book.probe, book.balance().balance, [...book.entries.keys()]], [null, 95, ["e1"]]);
    assert.equal(new MeterLedger("max").observeProbe(1, 1, 0), "probe_unused");
  });

  it("re-anchors consumed on a probe and drops what it includes", () => {
    const book = new MeterLedger("count", MARGIN);
    book.observe(reading(0, 100, 1000));
    for (const [name, acked] of [["old", 1100], ["late", 1198], ["flying", null]] as [string, number | null][]) {
      book.record(name);
      if (acked !== null) book.acknowledged([name], acked * S);
    }
    assert.equal(book.observeProbe(1, 1200 * S, 5 * S), "probed");
    assert.deepEqual([...book.entries.keys()], ["late", "flying"]);
    const answer = book.balance();
    assert.deepEqual([answer.balance, answer.polarBalance, answer.pending, book.consumedBasis(), book.baseline], [97, 100, 3, 1, 1]);
    assert.equal(book.observeProbe(1, 1150 * S, 5 * S), "probe_unused");
    assert.equal(book.observeProbe(1, 1300 * S, 5 * S), "probe_rejected");
    assert.equal(book.rejections, 1);
    assert.equal(book.observe(reading(2, 120, 1320)), "accepted");
    assert.ok(book.probe !== null);
    assert.equal(book.balance().balance, 120 - 2 - 1);
    assert.equal(book.observe(reading(3, 120, 1370)), "accepted");
    assert.deepEqual([book.probe, book.balance().balance], [null, 120 - 3 - 1]);
  });

  it("learns when the window began from a reading that says so", () => {
    const book = new MeterLedger("sum", MARGIN);
    assert.equal(book.observe({ ...reading(0, 100, null), resetAtUs: 500 * S }), "no_watermark");
    assert.equal(book.resetHintUs, 500 * S);
    book.record("old", 5);
    book.acknowledged(["old"], 1010 * S);
    assert.equal(book.observe(reading(5, 100, 1100)), "accepted");
    book.record("new", 4);
    book.acknowledged(["new"], 1200 * S);
    const cycle = { ...reading(6, 50, 1300), resetAtUs: 1150 * S };
    assert.equal(book.observe({ ...cycle, modifiedAtUs: 900 * S }), "stale");
    assert.equal(book.resetHintUs, 500 * S); // a stale reading teaches nothing
    assert.equal(book.observe(cycle), "reset");
    assert.deepEqual([book.entries.size, book.balance().balance], [0, 44]);
    assert.equal(book.observe({ ...reading(7, 50, 1400), resetAtUs: 600 * S }), "accepted");
    assert.equal(book.resetHintUs, 1150 * S);
  });

  it("keeps a probe a reset reading does not cover, and starts a window at a known instant", () => {
    const book = new MeterLedger("sum", MARGIN);
    book.observe(reading(5, 100, 1000));
    book.record("e1", 3);
    book.acknowledged(["e1"], 1900 * S);
    assert.equal(book.observeProbe(8, 2000 * S, 0), "probed");
    assert.equal(book.observe(reading(0, 50, 2010)), "reset");
    assert.ok(book.probe !== null);
    assert.equal(book.balance().balance, 42);
    assert.equal(book.observe(reading(2, 50, 2100)), "accepted");
    assert.deepEqual([book.probe, book.balance().balance], [null, 48]);
    const hinted = new MeterLedger("sum", MARGIN);
    hinted.observe(reading(0, 100, 1000));
    hinted.record("old", 5);
    hinted.acknowledged(["old"], 1010 * S);
    assert.equal(hinted.observe(reading(5, 100, 1100)), "accepted");
    hinted.record("new", 4);
    hinted.acknowledged(["new"], 1200 * S);
    hinted.resetSeen(1150 * S);
    assert.equal(hinted.observe(reading(6, 50, 1300)), "reset");
    assert.deepEqual([hinted.entries.size, hinted.balance().balance], [0, 44]);
    assert.equal(hinted.observe(reading(7, 50, 1400)), "accepted");
  });
});

/** A model of Polar's customer meter (tests/core/_polar_public.py). */
class Polar {
  now = 1_800_000_000 * S;
  commits: [number, number][] = [];
  credits: [number, number][] = [];
  resetAt = 0;
  readings: PolarReading[] = [];
  constructor(readonly skewUs: number) {}
  tick(us = 1000): void {
    this.now += us;
  }
  credited(): number {
    let running = 0;
    for (const [at, units] of this.credits) if (at >= this.resetAt) running = Math.max(0, running + units);
    return running;
  }
  consumed(before: number | null = null): number {
    return this.commits
      .filter(([at]) => at >= this.resetAt && (before === null || at < before))
      .reduce((a, [, v]) => a + v, 0);
  }
  /** A quantities answer for the current window, from a replica `lagUs` behind. */
  probe(lagUs: number): number {
    this.tick();
    return this.consumed(this.now - lagUs);
  }
  recompute(gapUs = 0): void {
    this.tick();
    const consumed = this.consumed(this.now - gapUs);
    const credited = this.credited();
    this.readings.push({ ...reading(consumed, credited, null), modifiedAtUs: this.now });
  }
  grant(units: number): void {
    this.tick();
    this.credits.push([this.now, units]);
    this.recompute();
  }
  cycle(units: number): void {
    this.tick();
    this.resetAt = this.now;
    this.credits.push([this.now, units]);
    this.recompute();
  }
}

const op = fc.oneof(
  fc.tuple(fc.constant("track"), fc.integer({ min: 0, max: 5 })),
  fc.tuple(fc.constant("commit"), fc.integer({ min: 0, max: 1 })),
  fc.tuple(fc.constant("advance"), fc.integer({ min: 1, max: 4 * 3600 })),
  fc.tuple(fc.constant("recompute"), fc.integer({ min: 0, max: 30 })),
  fc.tuple(fc.constant("grant"), fc.integer({ min: -50, max: 50 })),
  fc.tuple(fc.constant("cycle"), fc.integer({ min: 0, max: 100 })),
  fc.tuple(fc.constant("deliver"), fc.integer({ min: 0, max: 1_000_000 })),
  fc.tuple(fc.constant("probe"), fc.integer({ min: 0, max: 20 })),
  fc.tuple(fc.constant("advance"), fc.integer({ min: 1, max: 30 })),
);

describe("the public-mode ledger against a model of Polar", () => {
  it("never reads above Polar's balance nor the truth (less an unseen credit decrease)", () => {
    fc.assert(
      fc.property(fc.array(op, { maxLength: 80 }), fc.integer({ min: -20, max: 20 }), (ops, skewS) => {
        const polar = new Polar(skewS * S);
        const book = new MeterLedger("sum", MARGIN);
        const flying: [string, number][] = [];
        const unacked: string[] = [];
        let n = 0;
        for (const [name, arg] of ops) {
          if (name === "track") {
            n += 1;
            book.record(`e${n}`, arg);
            flying.push([`e${n}`, arg]);
          } else if (name === "commit" && flying.length > 0) {
            const [id, value] = flying.shift() as [string, number];
            polar.tick();
            polar.commits.push([polar.now, value]);
            polar.tick(arg * S);
            if (arg) unacked.push(id);
            else book.acknowledged([id], polar.now + polar.skewUs);
            if (!arg && unacked.length > 0) book.acknowledged(unacked.splice(0), polar.now + polar.skewUs);
          } else if (name === "advance") polar.tick(arg * S);
          else if (name === "recompute") polar.recompute(arg * S);
          else if (name === "grant") polar.grant(arg);
          else if (name === "cycle") polar.cycle(arg);
          else if (name === "probe") {
            const sent = polar.now + polar.skewUs; // a replica `arg` s behind, against a margin of 5 s
            book.observeProbe(polar.probe(arg * S), sent, 5 * S);
          }
          else if (name === "deliver" && polar.readings.length > 0) {
            book.observe(polar.readings[arg % polar.readings.length] as PolarReading);
          }
          const local = book.balance();
          if (local.balance === null || book.anchor === null) continue;
          assert.ok(local.balance <= book.anchor.balance);
          const unseen = Math.max(0, book.anchor.credited - polar.credited());
          assert.ok(local.balance <= polar.credited() - polar.consumed() + unseen + 1e-9);
        }
      }),
      { numRuns: 300 },
    );
  });
});
