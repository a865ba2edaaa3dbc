/** The driver stays a set of small modules with one job each: a module that grows past the limit
 * is a concern that wants a module of its own (as tests/drivers/test_driver_size.py holds the
 * Python drivers). */

import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";

const DRIVER = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "src", "driver");
const MOST_LINES = 500; // any driver module
const MOST_CLIENT_LINES = 450; // the public client: its options, construction, lifecycle, track, the warm read

function modules(): string[] {
  return readdirSync(DRIVER)
    .filter((name) => name.endsWith(".ts"))
    .sort();
}

/** Lines as an editor counts them: a last line without its newline counts too. */
function lines(name: string): number {
  const text = readFileSync(join(DRIVER, name), "utf8");
  return text.split("\n").length - (text.endsWith("\n") ? 1 : 0);
}

describe("the driver's modules", () => {
  it("are there to check", () => {
    const names = new Set(modules());
    for (const name of ["outpost.ts", "context.ts", "delivery.ts", "effects.ts"]) assert.ok(names.has(name), name);
  });

  for (const name of modules()) {
    const most = name === "outpost.ts" ? MOST_CLIENT_LINES : MOST_LINES;
    it(`${name} stays within ${most} lines`, () => {
      const count = lines(name);
      assert.ok(count <= most, `${name}: ${count} lines, more than ${most}`);
    });
  }
});
