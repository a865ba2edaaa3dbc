// Manual measurement (not a test): track() and balance() with Redis at a closed port, close()
// with Polar, Redis or both down. Run: node --import tsx test/support/measure_failures.ts
import { Outpost } from "../../src/index.js";
import { CALLS_FILTER, Emulator } from "./emulator.js";
import { RedisServer, freePort } from "./redisServer.js";

const lines: string[] = [];
const logger = { debug: (m: string) => lines.push(`DEBUG ${m}`), warn: (m: string) => lines.push(`WARN ${m}`), info: (m: string) => lines.push(`INFO ${m}`) };
const seconds = (t: number) => ((performance.now() - t) / 1000).toFixed(2);
const emulator = await Emulator.start();
const meter = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
{
  const o = new Outpost({ accessToken: emulator.token, serverUrl: emulator.url, redisUrl: `redis://127.0.0.1:${await freePort()}/0`, telemetry: false, logger });
  let t = performance.now();
  await o.track("api_call", { externalCustomerId: "c" }).catch((e: Error) => console.log(`track rejects after ${seconds(t)} s: ${e.name}: ${e.message}`));
  t = performance.now();
  await o.balance(meter, { externalCustomerId: "c" }).catch((e: Error) => console.log(`balance rejects after ${seconds(t)} s: ${e.name}: ${e.message}`));
  t = performance.now();
  await o.close(2);
  console.log(`close(2) with Redis down from the start: ${seconds(t)} s`);
}
for (const down of ["polar", "redis", "both"]) for (const timeout of [2, 10]) {
  const redis = await RedisServer.start();
  const polar = await Emulator.start();
  const m = await polar.createMeter("calls", CALLS_FILTER, { func: "count" });
  const o = new Outpost({ accessToken: polar.token, serverUrl: polar.url, redisUrl: redis.url, telemetry: true, telemetryInterval: 0.2, logger });
  await o.balance(m, { externalCustomerId: "c" });
  await o.track("api_call", { externalCustomerId: "c" });
  await new Promise((r) => setTimeout(r, 500)); // an export or two to the relay
  if (down !== "redis") await polar.stop();
  for (let i = 0; i < 3; i++) await o.track("api_call", { externalCustomerId: "c" });
  if (down !== "polar") redis.kill();
  const t = performance.now();
  await o.close(timeout);
  console.log(`close(${timeout}) with ${down} down: ${seconds(t)} s`);
  await Promise.all([redis.stop(), polar.stop()]);
}
await emulator.stop();
console.log(lines.filter((l) => !l.startsWith("DEBUG outpost load")).join("\n"));
