/** Starting an instance's background work on its first call, and stopping it at close().
 *
 * Every loop runs under the supervisor (supervisor.ts). A start that fails (the shard count
 * refused, Redis down) leaves nothing running, so the next call starts the instance again. */

import { ConfigurationError, OutpostClosed } from "../core/errors.js";
import { DEFAULT_SHARDS, SHARDS_KEY, allOutboxes } from "../core/keys.js";
import { firstCount, shardsDisagreement } from "../core/shards.js";
import { reachable, redisUnavailable } from "./connections.js";
import type { DriverContext } from "./context.js";
import type { Deliveries } from "./delivery.js";
import type { SessionEffects } from "./effects.js";
import { logError } from "./logger.js";
import { monotonic } from "./signal.js";
import { Subscriber } from "./subscriber.js";
import { supervised } from "./supervisor.js";
import { tickLoop } from "./ticks.js";

const CLOSE_RESERVE = 1.0; // seconds of close()'s timeout kept for what comes after its flush
const LAST_EXPORT = 0.75; // most seconds close() gives the last telemetry export

export class Lifecycle {
  private readonly workers: Promise<void>[] = [];
  private readonly subscriber: Subscriber;
  private starting: Promise<void> | null = null;

  constructor(
    private readonly ctx: DriverContext,
    private readonly effects: SessionEffects,
    private readonly delivery: Deliveries,
  ) {
    this.subscriber = new Subscriber(ctx, effects);
  }

  ensureStarted(): Promise<void> {
    if (this.ctx.closed) return Promise.reject(new OutpostClosed("this Outpost instance is closed"));
    this.starting ??= this.startNow();
    return this.starting;
  }

  private async startNow(): Promise<void> {
    const ctx = this.ctx;
    try {
      await this.agreeOnShards(); // nothing is written before the count is agreed
      await ctx.public.beforeStart(); // the mode asked for against the one Redis caches
    } catch (exc) {
      this.starting = null; // refused or Redis down: nothing runs, the next call tries again
      throw exc;
    }
    await this.effects.readCachedConfiguration();
    this.subscriber.start();
    this.workers.push(supervised(ctx, "tick", () => tickLoop(ctx, this.effects)));
    this.workers.push(
      ctx.public.run().catch((exc: unknown) => {
        logError(ctx.log, `outpost: the public mode's loop failed: ${String(exc)}`);
      }),
    );
    if (ctx.accessToken) {
      this.workers.push(...this.delivery.start());
    } else {
      ctx.log.warn("outpost has no access token: events stay queued in Redis until an instance with a token delivers them");
    }
  }

  /** The deployment's shard count, agreed with Redis once, at start: stored where Redis holds
   * none (16 where outbox streams of instances that could not choose one are there), refused
   * with ConfigurationError where Redis holds another. */
  private async agreeOnShards(): Promise<void> {
    const ctx = this.ctx;
    let stored: string | null;
    try {
      reachable(ctx.redis);
      stored = await ctx.redis.get(SHARDS_KEY);
      if (stored === null) {
        let legacy = 0;
        for (const stream of allOutboxes(DEFAULT_SHARDS)) legacy += await ctx.redis.exists(stream); // one slot each
        await ctx.redis.set(SHARDS_KEY, String(firstCount(ctx.shards, legacy > 0)), "NX"); // a race: one wins
        stored = await ctx.redis.get(SHARDS_KEY);
      }
    } catch (exc) {
      const unavailable = redisUnavailable("reading the deployment's shard count", exc, ctx.redis); // (a bug: thrown as it is)
      ctx.redisFailed(ctx.stateOutage, exc); // said once, then once a minute, while it lasts
      throw unavailable;
    }
    ctx.redisAnswered(ctx.stateOutage);
    const why = shardsDisagreement(ctx.shards, stored);
    if (why !== null) throw new ConfigurationError(why);
  }

  /** close(): flush (unless delivery is known to be stalled), stop the workers and release
   * connections, within `timeout` seconds whatever is down. */
  async close(timeout: number, flush: (timeout: number) => Promise<boolean>): Promise<void> {
    const ctx = this.ctx;
    if (ctx.closed) return;
    const deadline = monotonic() + timeout;
    const left = () => Math.max(0, deadline - monotonic());
    ctx.telemetry.quiet(); // an exporter failing from here on is one DEBUG line at the end
    const blocked = ctx.deliveries.find((d) => d.blocked)?.stalled ?? null;
    if (blocked !== null) {
      // Polar refuses what only an operator fixes: a flush could only wait it out.
      ctx.log.warn(`outpost closes without flushing (delivery is stalled: ${blocked}); the queued events stay in Redis for the next instance`);
    } else if (this.starting !== null && ctx.deliveries.length) {
      // What comes after the flush (workers, hand-back, the last export) keeps a reserve.
      const flushing = flush(timeout - Math.min(CLOSE_RESERVE, timeout / 2)).catch(() => false);
      await within(flushing, left() - Math.min(CLOSE_RESERVE, timeout / 2)); // Redis down: events stay queued
    }
    this.effects.feed({ kind: "Closing" }); // a close frame to Polar while the socket is still open
    ctx.closed = true;
    ctx.closing.abort();
    ctx.signal.fire();
    ctx.deliveryWake.fire();
    this.effects.socket.drop(); // after the close frame Closing queued; destroyed if Polar lingers
    this.subscriber.stop();
    // A loop waiting on Redis (a blocking read, a connection attempt) ends when its connection
    // is dropped below; the reserve keeps time for the hand-back and the last export.
    await within(Promise.allSettled(this.workers), left() - Math.min(LAST_EXPORT, left() / 2));
    if (ctx.deliveries.length) await within(this.delivery.handBack(ctx.redis), left() - Math.min(LAST_EXPORT, left() / 2));
    for (const connection of ctx.connections) connection.disconnect();
    ctx.durable.close();
    await ctx.telemetry.shutdown(monotonic(), ...ctx.syncCounts(), Math.min(LAST_EXPORT, left()));
    if (ctx.ownsRedis) ctx.redis.disconnect();
    await ctx.traces.close();
  }
}

/** Resolves when `work` settles or after `seconds`, whichever comes first (work goes on). */
async function within(work: Promise<unknown>, seconds: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, Math.max(0, seconds) * 1000);
  });
  try {
    await Promise.race([work.then(() => undefined, () => undefined), timeout]);
  } finally {
    clearTimeout(timer);
  }
}
