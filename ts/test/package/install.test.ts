/** The package as a Node developer gets it: `npm pack` (which builds), the tarball installed into
 * a fresh project, then an ES module, a CommonJS script and a TypeScript file compiled by `tsc`
 * with the settings `tsc --init` writes, each tracking an event and reading a balance against
 * the emulator and a real redis-server. The dependencies come from the npm cache `npm ci` filled. */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { REPO } from "../support/paths.js";
import { RedisServer } from "../support/redisServer.js";

const run = promisify(execFile);
const TS = join(REPO, "ts");
const TSC = join(TS, "node_modules", "typescript", "bin", "tsc");
const NPM = process.platform === "win32" ? "npm.cmd" : "npm";

interface Packed {
  filename: string;
  files: { path: string }[];
}

/** What a script prints: the balance it read after tracking one event. */
interface Printed {
  consumed: number;
  eventId: string;
  coreHasKeys: boolean;
}

/** A script that tracks one event and reads its balance, in the given module syntax. */
function script(importLines: string, settings: { token: string; serverUrl: string; redisUrl: string; meter: string }, customer: string): string {
  return `${importLines}
async function main() {
  const outpost = new Outpost({ accessToken: ${JSON.stringify(settings.token)}, serverUrl: ${JSON.stringify(settings.serverUrl)}, redisUrl: ${JSON.stringify(settings.redisUrl)}, telemetry: false });
  try {
    await outpost.balance(${JSON.stringify(settings.meter)}, { externalCustomerId: ${JSON.stringify(customer)} });
    const eventId = await outpost.track("api_call", { externalCustomerId: ${JSON.stringify(customer)} });
    const b = await outpost.balance(${JSON.stringify(settings.meter)}, { externalCustomerId: ${JSON.stringify(customer)} });
    console.log(JSON.stringify({ consumed: b.consumed, eventId, coreHasKeys: typeof core.allOutboxes === "function" }));
  } finally {
    await outpost.close(5);
  }
}
main().catch((exc) => { console.error(exc); process.exitCode = 1; });
`;
}

describe("the package, installed from its tarball into a fresh project", () => {
  let redis: RedisServer;
  let emulator: Emulator;
  let meter: string;
  let work: string;
  let project: string;
  let packed: Packed;

  before(async () => {
    work = mkdtempSync(join(tmpdir(), "outpost-ts-package-"));
    project = join(work, "app");
    const [server, polar, packing] = await Promise.all([
      RedisServer.start(),
      Emulator.start(),
      run(NPM, ["pack", "--json", "--pack-destination", work], { cwd: TS, maxBuffer: 16 * 1024 * 1024 }),
    ]);
    redis = server;
    emulator = polar;
    meter = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
    packed = (JSON.parse(packing.stdout) as Packed[])[0] as Packed;
    await run("mkdir", ["-p", project]);
    writeFileSync(join(project, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", private: true, type: "module" }, null, 2));
    // The dependencies from the cache `npm ci` filled; the registry only for what it lacks.
    await run(NPM, ["install", "--no-audit", "--no-fund", "--prefer-offline", join(work, packed.filename)], { cwd: project, maxBuffer: 16 * 1024 * 1024 });
  });
  after(async () => {
    await Promise.all([redis?.stop(), emulator?.stop()]);
    if (work) rmSync(work, { recursive: true, force: true });
  });

  function settings() {
    return { token: emulator.token, serverUrl: emulator.url, redisUrl: redis.url, meter };
  }

  async function node(file: string): Promise<Printed> {
    const { stdout } = await run(process.execPath, [file], { cwd: project });
    return JSON.parse(stdout.trim().split("\n").at(-1) as string) as Printed;
  }

  it("ships the built code for both module systems, its declarations and maps that carry their sources", () => {
    const paths = new Set(packed.files.map((f) => f.path));
    for (const path of ["package.json", "README.md", "dist/index.js", "dist/index.d.ts", "dist/core/index.js", "dist/cjs/index.js", "dist/cjs/index.d.ts", "dist/cjs/core/index.js", "dist/cjs/package.json"]) {
      assert.ok(paths.has(path), `${path} is not in the tarball`);
    }
    assert.ok(![...paths].some((p) => p.startsWith("src/") || p.startsWith("test/")), "sources or tests shipped");
    const installed = join(project, "node_modules", "polar-outpost");
    const map = JSON.parse(readFileSync(join(installed, "dist", "driver", "outpost.js.map"), "utf8")) as { sourcesContent?: string[] };
    assert.ok(map.sourcesContent?.[0]?.includes("export class Outpost"), "the source map does not carry its source");
    const manifest = JSON.parse(readFileSync(join(installed, "package.json"), "utf8")) as { license: string };
    assert.equal(manifest.license, "Apache-2.0");
    // The repository's licence text goes in when the repository has one.
    if (existsSync(join(REPO, "LICENSE"))) assert.ok(paths.has("LICENSE"), "LICENSE is not in the tarball");
  });

  it("works as an ES module", async () => {
    writeFileSync(join(project, "esm.mjs"), script('import { Outpost } from "polar-outpost";\nimport * as core from "polar-outpost/core";', settings(), "esm"));
    const printed = await node("esm.mjs");
    assert.equal(printed.consumed, 1);
    assert.equal(printed.coreHasKeys, true);
  });

  it("works from CommonJS", async () => {
    writeFileSync(join(project, "cjs.cjs"), script('const { Outpost } = require("polar-outpost");\nconst core = require("polar-outpost/core");', settings(), "cjs"));
    const printed = await node("cjs.cjs");
    assert.equal(printed.consumed, 1);
    assert.equal(printed.coreHasKeys, true);
  });

  it("type checks with tsc --init's settings, as an ES module and as CommonJS, and the compiled module runs", async () => {
    await run(process.execPath, [TSC, "--init"], { cwd: project });
    const typed = script('import { Outpost, type Balance } from "polar-outpost";\nimport * as core from "polar-outpost/core";\nconst unused: Balance | null = null; void unused;', settings(), "typed");
    // No @types/node in a fresh project (tsc --init sets "types": []): declare what the script uses.
    writeFileSync(join(project, "typed.ts"), `declare const console: { log(s: string): void; error(e: unknown): void };\ndeclare const process: { exitCode: number };\n${typed}`);
    writeFileSync(join(project, "required.cts"), 'import outpost = require("polar-outpost");\nimport core = require("polar-outpost/core");\nconst made: typeof outpost.Outpost = outpost.Outpost;\nconst keys: string[] = core.allOutboxes(64);\nvoid made;\nvoid keys;\n');
    try {
      await run(process.execPath, [TSC], { cwd: project });
    } catch (exc) {
      const failed = exc as { stdout?: string; stderr?: string };
      assert.fail(`tsc failed:\n${failed.stdout ?? ""}${failed.stderr ?? ""}`);
    }
    const printed = await node("typed.js");
    assert.equal(printed.consumed, 1);
  });
});
