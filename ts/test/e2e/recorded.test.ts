/** Traces recorded by the TypeScript driver (`recordTo`) replay through both cores: the Python
 * core answers a TypeScript run exactly as the TypeScript core did (the reverse of
 * test/conformance/traces.test.ts). */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { InvalidEvent, Outpost } from "../../src/index.js";
import { PythonRandom } from "../../src/core/random.js";
import { type Record_, replayDelivery, replaySession } from "../../src/core/trace.js";
import { CALLS_FILTER, Emulator, PYTHON } from "../support/emulator.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { REPO } from "../support/paths.js";
import { RedisServer } from "../support/redisServer.js";
import { testOptions } from "../support/testOptions.js";

describe("traces recorded by the TypeScript driver", () => {
  let redis: RedisServer;
  let emulator: Emulator;
  const directory = mkdtempSync(join(tmpdir(), "outpost-ts-traces-"));
  let files: string[] = [];

  before(async () => {
    [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start()]);
    const calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
    const customer = uniqueCustomer();
    const outpost = new Outpost(testOptions(emulator, redis, { recordTo: directory }));
    await outpost.balance(calls, { externalCustomerId: customer });
    await outpost.track("api_call", { externalCustomerId: customer, metadata: { tokens: 3, ratio: 0.5 } });
    await assert.rejects(outpost.track("", { externalCustomerId: customer }), InvalidEvent);
    await outpost.track("api_call", { externalCustomerId: customer });
    assert.equal(await outpost.flush(10), true);
    await emulator.admin("credits", { meter_id: calls, external_customer_id: customer, units: 5 });
    await eventually(async () => (await outpost.balance(calls, { externalCustomerId: customer })).credited === 5, "the pushed credit");
    await outpost.close(5);
    files = readdirSync(directory).sort().map((name) => join(directory, name));
  });
  after(async () => {
    rmSync(directory, { recursive: true, force: true });
    await Promise.all([redis.stop(), emulator.stop()]);
  });

  const read = (path: string): Record_[] =>
    readFileSync(path, "utf-8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l) as Record_);

  it("hold a session and a delivery trace, with calls, errors and effects", () => {
    assert.deepEqual(files.map((f) => f.slice(directory.length + 1)), ["delivery-0.jsonl", "session.jsonl"]);
    const session = read(files[1] as string);
    assert.ok(session.some((r) => r.t === "call" && r.method === "track" && "error" in r));
    assert.ok(session.some((r) => r.t === "effects"));
  });

  it("replay through the TypeScript core", () => {
    for (const file of files) {
      const records = read(file);
      const rng = (seed: number) => new PythonRandom(seed);
      const mismatches = records[0]?.machine === "session" ? replaySession(records, rng) : replayDelivery(records, rng);
      assert.deepEqual(mismatches.slice(0, 1), [], file);
    }
  });

  it("replay through the Python core", () => {
    const result = spawnSync(PYTHON, [join(REPO, "ts", "test", "support", "python_replay.py"), ...files], { cwd: REPO, encoding: "utf-8" });
    assert.equal(result.status, 0, result.stderr);
    const answers = result.stdout.trim().split("\n").map((l) => JSON.parse(l) as { file: string; mismatches: unknown[] });
    assert.equal(answers.length, 2);
    for (const answer of answers) assert.deepEqual(answer.mismatches, [], answer.file);
  });
});
