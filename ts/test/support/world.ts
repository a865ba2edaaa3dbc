/** What an end-to-end describe block shares: a real redis-server and the emulator, started before
 * its tests and stopped after them, a meter counting `api_call` events, and instances that close
 * after each test (every instance on one Redis delivers any instance's events). */

import { after, afterEach, before } from "node:test";
import { Outpost, type OutpostOptions } from "../../src/index.js";
import { CALLS_FILTER, Emulator } from "./emulator.js";
import { RedisServer } from "./redisServer.js";
import { testOptions } from "./testOptions.js";

export interface World {
  readonly redis: RedisServer;
  readonly emulator: Emulator;
  /** The id of the meter counting `api_call` events. */
  readonly calls: string;
  /** A new instance on this world, closed after the test; `options` override the test defaults. */
  connect(options?: OutpostOptions): Outpost;
  /** `closable` (a Python peer, say) closed after the test; returns it. */
  closing<T extends Closable>(closable: T): T;
}

interface Closable {
  close(timeout?: number): Promise<void>;
}

/** Call inside `describe`: registers the hooks that start and stop the world. */
export function world(): World {
  let redis: RedisServer | undefined;
  let emulator: Emulator | undefined;
  let calls: string | undefined;
  const open: Closable[] = [];
  before(async () => {
    [redis, emulator] = await Promise.all([RedisServer.start(), Emulator.start()]);
    calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  });
  afterEach(async () => {
    await Promise.allSettled(open.splice(0).map((o) => o.close(5)));
  });
  after(async () => {
    await Promise.all([redis?.stop(), emulator?.stop()]);
  });
  const started = <T>(value: T | undefined): T => {
    if (value === undefined) throw new Error("the world starts in `before`: use it inside a test");
    return value;
  };
  return {
    get redis() {
      return started(redis);
    },
    get emulator() {
      return started(emulator);
    },
    get calls() {
      return started(calls);
    },
    connect(options: OutpostOptions = {}): Outpost {
      return closing(new Outpost(testOptions(started(emulator), started(redis), { retryBase: 0.05, ...options })));
    },
    closing,
  };
  function closing<T extends Closable>(closable: T): T {
    open.push(closable);
    return closable;
  }
}
