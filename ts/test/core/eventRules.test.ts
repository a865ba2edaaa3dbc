/** conformance/events.json, the one table of track() rules, against this SDK's validator: it
 * decides each event as the Python core does (the emulator checks the Polar column). */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { buildEvent, customerOf, decimalFits, eventIdOf } from "../../src/core/event.js";
import { CONFORMANCE } from "../support/paths.js";

type Json = any; // eslint-disable-line @typescript-eslint/no-explicit-any
const VECTORS: Json[] = JSON.parse(readFileSync(join(CONFORMANCE, "events.json"), "utf-8")).vectors;

function decides(event: Json): string {
  try {
    buildEvent({
      eventId: eventIdOf(event.external_id, "unused"),
      name: event.name,
      customer: customerOf(event.external_customer_id, event.customer_id),
      metadata: event.metadata,
      timestampUs: 0,
    });
  } catch (error) {
    if ((error as Error).name === "InvalidEvent") return "refuse";
    throw error;
  }
  return "accept";
}

describe("track() rules (conformance/events.json)", () => {
  for (const vector of VECTORS) {
    it(vector.rule, () => assert.equal(decides(vector.event), vector.outpost));
  }

  it("reads a _cost amount as JSON writes it", () => {
    for (const ok of [0, 150, 1e-12, 12345.123456789012, 1e16, -2.5]) assert.ok(decimalFits(ok), String(ok));
    for (const bad of [1e-13, 1 / 3, 1e17, 1e20, 0.1 + 0.2]) assert.ok(!decimalFits(bad), String(bad));
  });
});
