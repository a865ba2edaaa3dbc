/** The driver's telemetry buffer: recording what it holds must not hold the event loop. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Telemetry } from "../../src/driver/telemetry.js";

describe("telemetry", () => {
  it("lets the event loop run between slices of a large flush", async () => {
    const telemetry = new Telemetry(true, { url: null, token: null, interval: 30, toApp: true });
    for (let i = 0; i < 5_000; i++) telemetry.tracked("external:c", ["m"], 0.001, "ok", 1);
    let flushed = false;
    let ranMeanwhile = false;
    setImmediate(() => {
      ranMeanwhile = !flushed;
    });
    await telemetry.flush(10, 0, 0);
    flushed = true;
    assert.equal(ranMeanwhile, true, "a callback waiting on the loop ran while the flush recorded");
  });
});
