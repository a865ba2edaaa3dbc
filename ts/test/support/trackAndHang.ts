/** A process that tracks events, lets its delivery loop read them (they are then pending for its
 * consumer), says so on stdout and hangs until it is killed: a crashed instance's leftovers. */

import { Redis } from "ioredis";
import { Outpost } from "../../src/index.js";

const options = JSON.parse(process.argv[2] as string) as { token: string; server: string; redis: string; customer: string; count: number; heartbeat: number };
const outpost = new Outpost({
  accessToken: options.token,
  serverUrl: options.server,
  redisUrl: options.redis,
  telemetry: false,
  linger: 3600, // hold what it reads: the batch is never posted
  heartbeat: options.heartbeat,
  logger: { debug: () => {}, warn: () => {} },
});
for (let i = 0; i < options.count; i++) await outpost.track("api_call", { externalCustomerId: options.customer });
const probe = new Redis(options.redis);
for (;;) {
  let pending = 0;
  for (let shard = 0; shard < 16; shard++) {
    const summary = (await probe.xpending(`outpost:v2:{${shard}}:outbox`, "outpost")) as [number, ...unknown[]];
    pending += Number(summary[0]);
  }
  if (pending >= options.count) break;
  await new Promise((resolve) => setTimeout(resolve, 10));
}
process.stdout.write("held\n");
setInterval(() => {}, 1 << 30);
