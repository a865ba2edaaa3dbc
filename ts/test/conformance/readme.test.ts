import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { SCRIPT_SHA1 } from "../../src/core/scripts.generated.js";
import { compose, render, TARGET } from "../../scripts/gen-scripts.js";
import { CONFORMANCE } from "../support/paths.js";

describe("the composed scripts", () => {
  it("are what ../lua composes now (npm run gen after a Lua change)", () => {
    assert.equal(readFileSync(TARGET, "utf-8"), render(compose()));
  });

  it("have the SHA1s of conformance/README.md §3", () => {
    const readme = readFileSync(join(CONFORMANCE, "README.md"), "utf-8");
    const table = Object.fromEntries([...readme.matchAll(/^\| `(\w+)` \| `([0-9a-f]{40})` \|$/gm)].map((m) => [m[1], m[2]]));
    assert.deepEqual(table, SCRIPT_SHA1);
  });
});
