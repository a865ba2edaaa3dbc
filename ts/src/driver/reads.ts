/** A read the warm path (Outpost.balance) could not answer from memory: it starts the instance if
 * need be, then waits for the customer's copy (its load, Polar's snapshot or figures) up to
 * snapshotTimeout, or goes to Redis (fresh, or a copy that does not follow Redis). */

import { Balance } from "../core/balance.js";
import type { Fetch } from "../core/effects.js";
import { NotReady, RedisUnavailable, UnknownMeter, UnsupportedMeter } from "../core/errors.js";
import { customerOf } from "../core/event.js";
import type { RawFields } from "../core/inputs.js";
import { reachable, redisUnavailable } from "./connections.js";
import { type DriverContext, SETTLE } from "./context.js";
import type { SessionEffects } from "./effects.js";
import { monotonic } from "./signal.js";
import { customerAttribute } from "./telemetry.js";

export class Reads {
  constructor(
    private readonly ctx: DriverContext,
    private readonly effects: SessionEffects,
    /** Starts the instance unless it runs (rejects as the first call's start does). */
    private readonly ensureStarted: () => Promise<void>,
  ) {}

  /** A read that waits or goes to Redis, counted for telemetry by how it ended. */
  async coldBalance(meterId: string, external: string | null, internal: string | null, fresh: boolean, started: number): Promise<Balance> {
    const telemetry = this.ctx.telemetry;
    let outcome = "not_ready";
    try {
      const found = await this.balanceWhenReady(meterId, external, internal, fresh);
      outcome = "cold";
      return found;
    } catch (exc) {
      if (exc instanceof UnknownMeter) outcome = "unknown_meter";
      else if (exc instanceof UnsupportedMeter) outcome = "unsupported_meter";
      throw exc;
    } finally {
      if (telemetry.enabled) telemetry.readDone(meterId, customerAttribute(external, internal), (performance.now() - started) / 1000, outcome);
    }
  }

  /** Start the instance, trying again while Redis cannot answer until `deadline`: a first read
   * waits for Redis as long as for its snapshot, then is NotReady. */
  private async startedBy(deadline: number): Promise<void> {
    for (;;) {
      try {
        await this.ensureStarted();
        return;
      } catch (exc) {
        if (!(exc instanceof RedisUnavailable)) throw exc;
        const remaining = deadline - monotonic();
        if (remaining <= 0) {
          const timeout = this.ctx.core.settings.snapshotTimeout;
          throw new NotReady(`the local state could not be loaded from Redis after ${timeout} s (Redis unreachable: ${exc.message})`);
        }
        await new Promise((resolve) => setTimeout(resolve, Math.min(remaining, SETTLE) * 1000));
      }
    }
  }

  private async balanceWhenReady(meterId: string, external: string | null, internal: string | null, fresh: boolean): Promise<Balance> {
    const ctx = this.ctx;
    const deadline = monotonic() + ctx.core.settings.snapshotTimeout;
    await this.startedBy(deadline);
    for (;;) {
      const version = ctx.signal.version;
      const remaining = deadline - monotonic();
      // At the deadline, a copy still waiting for the subscription reads Redis.
      const found = ctx.core.read(meterId, external, internal, fresh || remaining <= 0);
      const effects = ctx.drain();
      // Run them whatever the read found: dropping them would leave their flow waiting.
      if (effects.length) await this.effects.run(effects);
      if (found !== null && !(found instanceof Balance)) {
        const fetched = await this.fetch(found, meterId, external, internal);
        if (fetched !== null) return fetched;
      } else if (found !== null) {
        return found;
      } else if (effects.length) {
        continue;
      }
      ctx.public.wanted(external, internal);
      if (remaining <= 0) {
        let reason = ctx.core.notReadyReason(meterId, external, internal);
        if (ctx.public.mode !== "snapshots") reason = ctx.public.notReadyReason(reason, String(customerOf(external, internal)));
        throw new NotReady(`${reason} after ${ctx.core.settings.snapshotTimeout} s${ctx.redisCause()}`);
      }
      if (ctx.core.configuration === null) await this.effects.readCachedConfiguration();
      await ctx.signal.wait(version, Math.min(remaining, SETTLE));
    }
  }

  /** A read that must not come from memory: one HGETALL per key of the customer and its
   * aliases, in one round trip, computed by the core. */
  private async fetch(fetch: Fetch, meterId: string, external: string | null, internal: string | null): Promise<Balance | null> {
    const ctx = this.ctx;
    let fields: Map<string, RawFields>;
    try {
      fields = await this.hgetallEach(fetch.keys);
    } catch (exc) {
      throw redisUnavailable(`reading ${fetch.keys.join(", ")}`, exc, ctx.redis);
    }
    const found = ctx.core.readFetched(meterId, external, internal, fields);
    const effects = ctx.drain();
    if (effects.length) await this.effects.run(effects);
    return found;
  }

  private async hgetallEach(keys: string[]): Promise<Map<string, RawFields>> {
    const ctx = this.ctx;
    reachable(ctx.redis);
    if (ctx.cluster !== null) {
      // The keys' slots differ: one command each, all sent at once.
      const replies = await Promise.all(keys.map((key) => ctx.redis.hgetall(key)));
      return new Map(keys.map((key, i) => [key, replies[i] as RawFields]));
    }
    if (keys.length === 1) return new Map([[keys[0] as string, await ctx.redis.hgetall(keys[0] as string)]]);
    const pipeline = ctx.redis.pipeline();
    for (const key of keys) pipeline.hgetall(key);
    const replies = (await pipeline.exec()) ?? [];
    return new Map(
      keys.map((key, i) => {
        const [error, fields] = replies[i] ?? [new Error("no reply"), null];
        if (error) throw error;
        return [key, fields as RawFields];
      }),
    );
  }
}
