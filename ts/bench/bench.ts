/** Speed of the TypeScript SDK as ratios against baselines taken in the same run, in interleaved
 * rounds (this machine is shared and noisy): a warm balance() against one ioredis GET, track()
 * against its own script through a bare EVALSHA on the same client. Run from ts/:
 *     node --import tsx bench/bench.ts            (after ./dev created .venv: it starts the emulator)
 */

import { Redis } from "ioredis";
import { Outpost } from "../src/index.js";
import { SCRIPT_SHA1, SCRIPT_TEXT } from "../src/core/scripts.generated.js";
import { Session, makeSettings } from "../src/core/session.js";
import { CALLS_FILTER, Emulator } from "../test/support/emulator.js";
import { RedisServer } from "../test/support/redisServer.js";

const ROUNDS = 5;
const N = Number(process.env.BENCH_N ?? 2000);

async function timed(n: number, op: () => unknown): Promise<number> {
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await op();
  return Number(process.hrtime.bigint() - start) / n; // ns per operation
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

const [server, emulator] = await Promise.all([RedisServer.start(), Emulator.start()]);
try {
  const calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  const outpost = new Outpost({ accessToken: emulator.token, serverUrl: emulator.url, redisUrl: server.url, telemetry: false, logger: { debug: () => {}, warn: () => {} } });
  const redis = new Redis(server.url);
  await redis.set("k", "v");
  await redis.script("LOAD", SCRIPT_TEXT.track as string);
  // The baseline of track(): its own script through a bare EVALSHA, the same keys and arguments.
  const session = new Session(makeSettings());
  session.handle({ kind: "ConfigurationReceived", payload: { reducers: [{ id: "r", filter: CALLS_FILTER, aggregation: { func: "count" }, meter_ids: ["m"] }] }, fromCache: true });
  let k = 0;
  const bare = () => {
    const now = Date.now() * 1000;
    const run = session.track({ name: "api_call", externalCustomerId: "bare", timestampUs: now, nowUs: now, eventId: `b${k++}` });
    return redis.evalsha(SCRIPT_SHA1.track as string, run.keys.length, ...run.keys, ...run.args);
  };
  await outpost.balance(calls, { externalCustomerId: "bench" });
  const results: Record<string, number[]> = { warm: [], get: [], track: [], evalsha: [] };
  for (let round = 0; round < ROUNDS; round++) {
    results.get!.push(await timed(N, () => redis.get("k")));
    results.warm!.push(await timed(N * 50, () => outpost.balance(calls, { externalCustomerId: "bench" })));
    results.evalsha!.push(await timed(N, bare));
    results.track!.push(await timed(N, () => outpost.track("api_call", { externalCustomerId: "bench" })));
  }
  const m = Object.fromEntries(Object.entries(results).map(([k, v]) => [k, median(v)])) as Record<string, number>;
  console.log(`warm balance(): ${(m.warm! / 1000).toFixed(2)} µs; ioredis GET: ${(m.get! / 1000).toFixed(1)} µs; GET / warm read = ${(m.get! / m.warm!).toFixed(0)}x`);
  console.log(`track(): ${(m.track! / 1000).toFixed(1)} µs; its script through a bare EVALSHA: ${(m.evalsha! / 1000).toFixed(1)} µs; track / EVALSHA = ${(m.track! / m.evalsha!).toFixed(2)}x`);
  // Cross-instance lag: tracked on one instance, seen by a warm read on another.
  const other = new Outpost({ accessToken: emulator.token, serverUrl: emulator.url, redisUrl: server.url, telemetry: false, logger: { debug: () => {}, warn: () => {} } });
  await other.balance(calls, { externalCustomerId: "bench" });
  const lags: number[] = [];
  for (let i = 0; i < 300; i++) {
    const before = (await other.balance(calls, { externalCustomerId: "bench" })).consumed;
    await outpost.track("api_call", { externalCustomerId: "bench" });
    const tracked = process.hrtime.bigint();
    while ((await other.balance(calls, { externalCustomerId: "bench" })).consumed === before) await new Promise((r) => setImmediate(r));
    lags.push(Number(process.hrtime.bigint() - tracked) / 1000);
  }
  lags.sort((a, b) => a - b);
  const at = (q: number) => (lags[Math.min(lags.length - 1, Math.floor(q * lags.length))] as number).toFixed(0);
  console.log(`cross-instance lag after track() resolved: p50 ${at(0.5)} µs, p99 ${at(0.99)} µs`);
  await other.close(30);
  redis.disconnect();
  await outpost.close(30);
} finally {
  await Promise.all([server.stop(), emulator.stop()]);
}
