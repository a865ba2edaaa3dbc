/** What a describe block whose tests each start their own Redis shares: the emulator, started
 * before its tests and stopped after them, and a meter counting `api_call` events. */

import { after, before } from "node:test";
import { CALLS_FILTER, Emulator } from "./emulator.js";

/** Set in `before`: read them inside a test. */
class SharedEmulator {
  emulator!: Emulator;
  /** The id of the meter counting `api_call` events. */
  calls!: string;
}

/** Call inside `describe`: registers the hooks that start and stop the emulator. */
export function sharedEmulator(): SharedEmulator {
  const shared = new SharedEmulator();
  before(async () => {
    shared.emulator = await Emulator.start();
    shared.calls = await shared.emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  });
  after(async () => {
    await shared.emulator?.stop();
  });
  return shared;
}
