/** How the end-to-end tests wait out a failure: the error a call rejects with, and the moment
 * Redis takes writes again. */

import assert from "node:assert/strict";
import { type Outpost, RedisUnavailable } from "../../src/index.js";
import { eventually } from "./eventually.js";

/** The error `call` rejects with; a call that resolves fails the test. */
export async function rejection(call: Promise<unknown>): Promise<Error> {
  try {
    await call;
  } catch (exc) {
    return exc as Error;
  }
  assert.fail("resolved, expected a rejection");
}

/** Wait until `outpost` tracks an event for `customer` again: RedisUnavailable means not yet, any
 * other error fails the test. */
export async function untilTrackWorks(outpost: Outpost, customer: string, what: string, timeout = 20): Promise<void> {
  await eventually(
    async () => {
      try {
        await outpost.track("api_call", { externalCustomerId: customer });
        return true;
      } catch (exc) {
        if (!(exc instanceof RedisUnavailable)) throw exc;
        return false;
      }
    },
    what,
    timeout,
  );
}
