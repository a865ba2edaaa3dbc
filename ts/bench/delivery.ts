/** Delivery throughput of the TypeScript SDK: events per second from the outbox to the emulator,
 * against bare posts of the same kind of batches with the driver's own HTTP client (fetch), in
 * interleaved rounds (this machine is shared and noisy; compare the ratios). Run from ts/:
 *     node --import tsx bench/delivery.ts       (after ./dev created .venv: it starts the emulator)
 *
 * Each round queues fresh events in the outbox with the track script (pipelined, as track()
 * writes them: over 100 customers), then times an instance with an access token from its first
 * call, flush(), until flush() resolves (every event posted, acknowledged and removed from the
 * outbox). The baseline posts other fresh events of the same shape, 500 a request (the SDK's
 * default batch), one request after the other, as the SDK's one request in flight does.
 *
 * Then the same rounds against a Polar DISTANT_MS away: every ingest request, bare or the SDK's,
 * waits that long in the emulator before it is read (its ingest_hang fault), as Polar answers
 * across a network; there the SDK's work per batch overlaps the wait for the post, where on this
 * machine's shared cores it competes with the emulator's own.
 */

import { Redis } from "ioredis";
import { SCRIPT_SHA1, SCRIPT_TEXT } from "../src/core/scripts.generated.js";
import { BUDGET_KEY } from "../src/core/keys.js";
import type { RunScript } from "../src/core/effects.js";
import { Session, makeSettings } from "../src/core/session.js";
import { Outpost } from "../src/index.js";
import { CALLS_FILTER, Emulator } from "../test/support/emulator.js";
import { RedisServer } from "../test/support/redisServer.js";

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);
const EVENTS = Number(process.env.BENCH_EVENTS ?? 10_000); // per round and side
const CUSTOMERS = 100;
const BATCH = 500; // the SDK's default batch size
const DISTANT_MS = 20;
const QUIET = { debug: () => {}, warn: () => {} };

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

function runs(session: Session, tag: string): RunScript[] {
  const now = Date.now() * 1000;
  return Array.from({ length: EVENTS }, (_, n) =>
    session.track({ name: "api_call", externalCustomerId: `bench-dl-${tag}-${n % CUSTOMERS}`, timestampUs: now, nowUs: now, eventId: `${tag}-${n}` }),
  );
}

/** Events per second of bare ingestion requests of ``events`` (their items as track() wrote them). */
async function bare(emulator: Emulator, events: RunScript[]): Promise<number> {
  const items = events.map((run) => String(run.args[3]));
  const bodies: string[] = [];
  for (let i = 0; i < items.length; i += BATCH) bodies.push(`{"events":[${items.slice(i, i + BATCH).join(",")}]}`);
  const headers = { authorization: `Bearer ${emulator.token}`, "content-type": "application/json", "user-agent": "outpost-bench" };
  const start = process.hrtime.bigint();
  for (const body of bodies) {
    const answer = await fetch(`${emulator.url}/v1/events/ingest`, { method: "POST", headers, body });
    if (answer.status !== 200) throw new Error(`bare ingest answered ${answer.status}: ${await answer.text()}`);
    await answer.arrayBuffer();
  }
  return items.length / (Number(process.hrtime.bigint() - start) / 1e9);
}

async function queue(redis: Redis, events: RunScript[]): Promise<void> {
  for (let i = 0; i < events.length; i += 1000) {
    const pipeline = redis.pipeline();
    for (const run of events.slice(i, i + 1000)) pipeline.evalsha(SCRIPT_SHA1.track as string, run.keys.length, ...run.keys, ...run.args);
    await pipeline.exec();
  }
}

/** Events per second of an instance delivering what is queued, from its start to flush(). */
async function delivered(emulator: Emulator, server: RedisServer): Promise<number> {
  const outpost = new Outpost({ accessToken: emulator.token, serverUrl: emulator.url, redisUrl: server.url, telemetry: false, logger: QUIET });
  try {
    const start = process.hrtime.bigint();
    if (!(await outpost.flush(300))) throw new Error("the outbox was not delivered within 300 s");
    return EVENTS / (Number(process.hrtime.bigint() - start) / 1e9);
  } finally {
    await outpost.close(30);
  }
}

const [server, emulator] = await Promise.all([RedisServer.start(), Emulator.start()]);
try {
  await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  const redis = new Redis(server.url);
  await redis.script("LOAD", SCRIPT_TEXT.track as string);
  const session = new Session(makeSettings());
  const reducers = [{ id: "r", filter: CALLS_FILTER, aggregation: { func: "count" }, meter_ids: ["m"] }];
  session.handle({ kind: "ConfigurationReceived", payload: { reducers }, fromCache: true });
  for (const distant of [0, DISTANT_MS]) {
    if (distant) await emulator.admin("faults", { ingest_hang: { seconds: distant / 1000, count: 1_000_000 } });
    const where = distant ? ` (Polar ${distant} ms away)` : "";
    const rates: number[] = [];
    const baselines: number[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      baselines.push(await bare(emulator, runs(session, `raw${distant}-${round}`)));
      await queue(redis, runs(session, `sdk${distant}-${round}`));
      await redis.del(BUDGET_KEY); // each round starts with the shared request budget full
      rates.push(await delivered(emulator, server));
      const ratio = (rates[round] as number) / (baselines[round] as number);
      console.log(`round ${round}${where}: delivery ${rates[round]!.toFixed(0)} events/s, bare posts ${baselines[round]!.toFixed(0)} events/s, ${ratio.toFixed(2)}x`);
    }
    const ratios = rates.map((rate, i) => rate / (baselines[i] as number));
    console.log(
      `delivery${where}: ${median(rates).toFixed(0)} events/s; bare posts (fetch, one at a time): ${median(baselines).toFixed(0)} events/s; ` +
        `delivery / bare = ${median(ratios).toFixed(2)}x (median of ${ROUNDS} rounds; target at least 0.8x)`,
    );
  }
  await emulator.admin("faults", { clear: true });
  redis.disconnect();
} finally {
  await Promise.all([server.stop(), emulator.stop()]);
}
