import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { PythonRandom } from "../../src/core/random.js";
import { type Record_, replayDelivery, replaySession } from "../../src/core/trace.js";
import { CONFORMANCE } from "../support/paths.js";

const TRACES = join(CONFORMANCE, "traces");

function read(path: string): Record_[] {
  return readFileSync(path, "utf-8")
    .split("\n")
    .filter((line) => line.trim())
    .map((line) => JSON.parse(line) as Record_);
}

const files: string[] = [];
for (const scenario of readdirSync(TRACES).sort()) {
  for (const instance of readdirSync(join(TRACES, scenario)).sort()) {
    for (const file of readdirSync(join(TRACES, scenario, instance)).sort()) {
      if (file.endsWith(".jsonl")) files.push(join(scenario, instance, file));
    }
  }
}

describe("the core replays every recorded trace", () => {
  it("finds traces to replay", () => assert.ok(files.length >= 14));
  for (const file of files) {
    it(file, () => {
      const records = read(join(TRACES, file));
      const rng = (seed: number) => new PythonRandom(seed);
      const mismatches = records[0]?.machine === "session" ? replaySession(records, rng) : replayDelivery(records, rng);
      assert.deepEqual(mismatches.slice(0, 1), []);
    });
  }
});
