/** What a describe block whose tests each start their own Redis shares: the emulator, started
 * before its tests and stopped after them, and a meter counting `api_call` events. */

import { after, before } from "node:test";
import { CALLS_FILTER, Emulator } from "./emulator.js";

export interface SharedEmulator {
  readonly emulator: Emulator;
  /** The id of the meter counting `api_call` events. */
  readonly calls: string;
}

/** Call inside `describe`: registers the hooks that start and stop the emulator. */
export function sharedEmulator(): SharedEmulator {
  let emulator: Emulator | undefined;
  let calls: string | undefined;
  before(async () => {
    emulator = await Emulator.start();
    calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  });
  after(async () => {
    await emulator?.stop();
  });
  const started = <T>(value: T | undefined): T => {
    if (value === undefined) throw new Error("the emulator starts in `before`: use it inside a test");
    return value;
  };
  return {
    get emulator() {
      return started(emulator);
    },
    get calls() {
      return started(calls);
    },
  };
}
