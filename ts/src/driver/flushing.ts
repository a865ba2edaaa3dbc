/** flush()'s wait: the outboxes' last entries when it starts, then the core's FlushWatch says when
 * to look again whether any up to those marks is left. */

import { type EntryId, FlushWatch, lastEntries } from "../core/flushWatch.js";
import { reachable, redisUnavailable, together } from "./connections.js";
import { type DriverContext, POLL } from "./context.js";
import { monotonic } from "./signal.js";

const FLUSH_READS = 3; // attempts of a flush's outbox read before it rejects with RedisUnavailable

/** Deliver every event queued when the call started, by any instance: true once each was
 * delivered or dropped, false if some were still queued after `timeout` seconds. Rejects with
 * RedisUnavailable when Redis cannot be read. */
export async function flushOutboxes(ctx: DriverContext, timeout: number): Promise<boolean> {
  const watch = new FlushWatch(await outboxMarks(ctx), monotonic(), timeout);
  ctx.flushing += 1;
  ctx.deliveryWake.fire();
  try {
    for (;;) {
      const version = ctx.deliveryWake.version;
      const state = { settling: ctx.settling > 0, holdingNothing: holdingNothing(ctx) };
      if (watch.lookNow(monotonic(), state) && watch.looked(await outboxLeft(ctx, watch.marks))) return true;
      const wait = watch.wait(monotonic());
      if (wait === null) return false;
      await ctx.deliveryWake.wait(version, wait); // a settle of this instance wakes it
    }
  } finally {
    ctx.flushing -= 1;
  }
}

/** Whether every delivery loop of this instance holds nothing read and not yet settled. */
function holdingNothing(ctx: DriverContext): boolean {
  return ctx.deliveries.every((d) => d.idle);
}

/** The last entry of each outbox now: what a flush waits to see delivered. */
async function outboxMarks(ctx: DriverContext): Promise<Map<string, EntryId>> {
  // All at once, in one write (a cluster: each to its node).
  const replies = await readOutboxes(ctx, () => together(ctx.redis, () => Promise.all(ctx.outboxes.map((stream) => ctx.redis.xrevrange(stream, "+", "-", "COUNT", 1)))));
  return lastEntries(ctx.outboxes, replies);
}

/** `read()` for a flush, tried again a few times on a Redis failure (a connection kept from
 * before Redis came back may fail once); past that, RedisUnavailable. A bug is thrown as it is. */
async function readOutboxes<T>(ctx: DriverContext, read: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      reachable(ctx.redis);
      return await read();
    } catch (exc) {
      const unavailable = redisUnavailable("reading the outboxes", exc, ctx.redis);
      if (attempt >= FLUSH_READS) throw unavailable;
      await ctx.pause(POLL);
    }
  }
}

/** Per stream the flush still waits for, whether an entry up to its mark is left (all read at
 * once, as the marks are). */
async function outboxLeft(ctx: DriverContext, marks: ReadonlyMap<string, EntryId>): Promise<Map<string, boolean>> {
  const streams = [...marks];
  const replies = await readOutboxes(ctx, () => together(ctx.redis, () => Promise.all(streams.map(([stream, mark]) => ctx.redis.xrange(stream, "-", mark, "COUNT", 1)))));
  return new Map(streams.map(([stream], i) => [stream, (replies[i] ?? []).length > 0]));
}
