/** The TypeScript core's anchoring against the Python core's on the same generated ledgers: the
 * same outcome, the same arguments for apply_anchor.lua byte for byte (the ledger's persistent
 * part included), for Polar's figures and quantities probes alike, so a fleet of both decides
 * alike. Runs where the repository's Python core has the public mode. */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, it } from "node:test";
import fc from "fast-check";
import { type Anchoring, anchor } from "../../src/core/publicAnchoring.js";
import type { PolarReading } from "../../src/core/publicLedger.js";
import { probeAnchor } from "../../src/core/publicProbes.js";
import { PYTHON } from "../support/emulator.js";
import { REPO } from "../support/paths.js";

const SEC = 1_000_000;
const T0 = 1_800_000_000 * SEC;
const SCRIPT = join(REPO, "ts", "test", "support", "python_anchoring.py");

interface Case {
  aggregation: string;
  margin_us: number;
  fields: Record<string, string>;
  events: Record<string, string>;
  reading: { external: string; meter: string; consumed: number; credited: number; balance: number; modified: number | null; reset: number | null } | null;
  /** A quantities answer instead of a reading. */
  probe?: { meter: string; consumed: number; sent: number; lag: number };
  known: number;
}

function python(cases: Case[]): unknown {
  const run = spawnSync(PYTHON, [SCRIPT], { input: JSON.stringify(cases), encoding: "utf8", cwd: join(REPO, "ts") });
  if (run.status !== 0) throw new Error(run.stderr);
  return JSON.parse(run.stdout) as unknown;
}

const value = fc.constantFrom(0, 1, 2, 3, 2.5, -1, 0.25);
const acked = fc.option(fc.integer({ min: -200, max: 200 }).map((s) => T0 + s * SEC), { nil: null });
const events = fc.array(fc.tuple(value, acked), { maxLength: 6 });
const reading = fc.record({
  consumed: fc.constantFrom(0, 1, 3, 5, 8, 2.5, 13),
  credited: fc.constantFrom(0, 10, 20),
  modified: fc.option(fc.integer({ min: -100, max: 400 }).map((s) => T0 + s * SEC), { nil: null, freq: 6 }),
  // Where a webhook says the window began (the subscription's period start).
  reset: fc.option(fc.integer({ min: -100, max: 400 }).map((s) => T0 + s * SEC), { nil: null, freq: 2 }),
});
const probeArb = fc.option(
  // Around the reading it follows: mostly newer, a little above its consumed.
  fc.record({
    extra: fc.constantFrom(-1, 0, 1, 2, 3, 0.5, 8),
    after: fc.integer({ min: -30, max: 300 }),
    lag: fc.constantFrom(0, 5 * SEC, 10 * SEC),
  }),
  { nil: null, freq: 2 },
);
const scenario = fc.record({
  aggregation: fc.constantFrom("count", "sum", "max", "avg", "min"),
  margin: fc.constantFrom(0, 10 * SEC, 60 * SEC),
  first: events,
  readings: fc.array(fc.record({ reading, probe: probeArb }), { minLength: 1, maxLength: 4 }),
  later: events,
});

describe("anchoring, differentially against the Python core", () => {
  const probe = python([]);
  it("decides every generated ledger alike", { skip: probe === "missing" ? "the Python core of this checkout has no public mode" : false }, () => {
    const cases: Case[] = [];
    const answers: unknown[] = [];
    fc.assert(
      fc.property(scenario, (s) => {
        let fields: Record<string, string> = {};
        const pending: Record<string, string> = {};
        let n = 0;
        const add = (list: [number, number | null][]) => {
          for (const [v, at] of list) pending[`1:e${n++}`] = at === null ? String(v) : `${v} ${at}`;
        };
        add(s.first);
        let known = -1;
        const decide = (c: Case, decided: Anchoring) => {
          cases.push(c);
          answers.push([decided.outcome, decided.write === null ? null : decided.write.args("chan", c.known), decided.problems.length, decided.rejections]);
          if (decided.write !== null) {
            known += 1;
            fields = { rev: String(known + 2), pub: decided.write.pub, sid: "public" };
            for (const field of decided.write.removed) delete pending[field];
          }
        };
        s.readings.forEach(({ reading: r, probe: q }, i) => {
          if (i === 1) add(s.later);
          const polar: PolarReading = { externalCustomerId: "c1", customerId: null, meterId: "m", consumed: r.consumed, credited: r.credited, balance: r.credited - r.consumed, modifiedAtUs: r.modified, resetAtUs: r.reset };
          const c: Case = {
            aggregation: s.aggregation,
            margin_us: s.margin,
            fields: { ...fields },
            events: { ...pending },
            reading: { external: "c1", meter: "m", consumed: r.consumed, credited: r.credited, balance: r.credited - r.consumed, modified: r.modified, reset: r.reset },
            known,
          };
          decide(c, anchor(s.aggregation, s.margin, c.fields, c.events, polar));
          if (q === null) return;
          const [consumed, sent] = [r.consumed + q.extra, (r.modified ?? T0) + q.after * SEC];
          const p: Case = { aggregation: s.aggregation, margin_us: s.margin, fields: { ...fields }, events: { ...pending }, reading: null, probe: { meter: "m", consumed, sent, lag: q.lag }, known };
          decide(p, probeAnchor(s.aggregation, s.margin, p.fields, p.events, "m", consumed, sent, q.lag));
        });
      }),
      { seed: 23, numRuns: 300 },
    );
    const probed = answers.filter((a) => (a as string[])[0] === "probed").length;
    assert.ok(probed > 20, `only ${probed} probes were used`); // the generator reaches the cases that matter
    const theirs = python(cases) as unknown[];
    for (let i = 0; i < cases.length; i++) assert.deepEqual(answers[i], theirs[i], JSON.stringify(cases[i]));
  });
});
