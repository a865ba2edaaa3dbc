/** The options every end-to-end test starts an Outpost with: this run's emulator and Redis, no
 * telemetry, a short linger, a silent logger; a test adds or overrides what it is about. */

import type { OutpostOptions } from "../../src/index.js";
import type { Emulator } from "./emulator.js";
import type { RedisServer } from "./redisServer.js";

export const QUIET = { debug: () => {}, warn: () => {} };

export function testOptions(emulator: Emulator, redis: RedisServer, options: OutpostOptions = {}): OutpostOptions {
  return {
    accessToken: emulator.token,
    serverUrl: emulator.url,
    redisUrl: redis.url,
    telemetry: false,
    linger: 0.02,
    logger: QUIET,
    ...options,
  };
}
