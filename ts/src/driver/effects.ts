/** Running the session's effects: the one way inputs reach the core and what it asks for gets
 * done.
 *
 * feed() hands the core one input and runs the effects it gives (in the background); heard() a
 * change a subscription brought. run() runs effects, and those their outcomes cause, until the
 * core asks for nothing more: its switch is the dispatch table, each effect the core can ask for
 * and what does it (the outcome goes back to the core as its input). */

import { CONFIGURATION_KEY } from "../core/keys.js";
import type { Effect } from "../core/effects.js";
import { RedisUnavailable } from "../core/errors.js";
import { jsonOr } from "../core/json.js";
import type { Input } from "../core/inputs.js";
import { describe, reachable } from "./connections.js";
import type { DriverContext } from "./context.js";
import { failedInRedis } from "./redisFailure.js";
import { runScript } from "./scripts.js";
import { monotonic } from "./signal.js";
import { LinkSocket } from "./websocket.js";

export class SessionEffects {
  /** The WebSocket's socket, which the core opens, writes and drops through its effects. */
  readonly socket: LinkSocket;

  constructor(private readonly ctx: DriverContext) {
    this.socket = new LinkSocket(ctx, (input) => this.feed(input));
  }

  /** Run effects, and those their outcomes cause, until the core asks for nothing more. */
  async run(effects: Effect[]): Promise<void> {
    const ctx = this.ctx;
    while (effects.length) {
      for (const effect of effects) {
        switch (effect.kind) {
          case "LoadIdentity":
            await this.load(effect.key, effect.loadId);
            break;
          case "StoreConfiguration":
            try {
              reachable(ctx.redis);
              await ctx.redis.set(effect.key, effect.text);
            } catch (exc) {
              if (!failedInRedis(exc)) throw exc;
              ctx.log.debug(`outpost could not cache the configuration: ${describe(exc, ctx.redis)}`);
            }
            break;
          case "RunScript": {
            let reply: unknown;
            try {
              reply = await runScript(ctx.redis, effect.script, effect.keys, effect.args);
            } catch (exc) {
              if (!(exc instanceof RedisUnavailable)) throw exc; // a bug of ours (runScript() says which)
              ctx.redisFailed(ctx.stateOutage, exc);
              if (effect.tag !== null) ctx.core.handle({ kind: "ScriptFailed", tag: effect.tag });
              continue;
            }
            ctx.redisAnswered(ctx.stateOutage);
            ctx.core.handle({ kind: "ScriptReplied", reply, tag: effect.tag }); // its echo is dropped when it comes
            break;
          }
          case "SendBytes":
            this.socket.send(effect.data);
            break;
          case "ListPending":
            await this.listPending(effect.tag, effect.keys);
            break;
          case "OpenConnection":
            this.socket.open(effect.host, effect.port, effect.tls, effect.timeout);
            break;
          case "CloseConnection":
            this.socket.drop();
            break;
          default: {
            const unhandled: never = effect; // an effect of the core without a case fails to compile
            throw new Error(`no case for ${JSON.stringify(unhandled)}`);
          }
        }
      }
      effects = ctx.drain();
    }
    const seen = ctx.core.observations();
    if (seen.length) ctx.telemetry.observe(seen);
    ctx.signal.fire();
  }

  /** Hand one input to the core and run what it asks for (in the background). */
  feed(input: Input): void {
    const ctx = this.ctx;
    const linkInput = input.kind === "BytesReceived" || input.kind === "ConnectionOpened" || input.kind === "ConnectionFailed";
    if (linkInput && ctx.core.remote === null) return; // a socket's last words after the public mode dropped the link
    ctx.core.handle(input);
    if (linkInput && ctx.public.decide()) this.socket.drop(); // Polar serves only its public API
    const effects = ctx.drain();
    if (effects.length || input.kind !== "Tick") {
      this.run(effects).catch((exc: unknown) => ctx.bug("running the core's effects", exc));
    }
  }

  tick(): void {
    this.feed({ kind: "Tick", now: monotonic(), wallUs: this.ctx.nowUs() });
  }

  /** A change published on a channel this instance follows. */
  heard(message: string): void {
    const ctx = this.ctx;
    if (ctx.core.ownEcho(message)) return; // this instance's own change, already applied
    const held = ctx.core.holding; // scripts of this instance in flight: it may be one's echo, come early
    ctx.core.handle({ kind: "ChangePublished", data: message });
    if (held) return; // applied with a reply (or a failure) of those scripts, and its effects run then
    ctx.core.handle({ kind: "Tick", now: monotonic(), wallUs: ctx.nowUs() });
    this.run(ctx.drain()).catch((exc: unknown) => ctx.bug("running the core's effects", exc));
  }

  /** The configuration another instance (or this one, before) cached in Redis, to the core. */
  async readCachedConfiguration(): Promise<void> {
    const ctx = this.ctx;
    const read = await this.fromRedis(() => ctx.redis.get(CONFIGURATION_KEY));
    if (read === null || read.value === null) return;
    ctx.core.handle({ kind: "ConfigurationReceived", payload: jsonOr(read.value, read.value), fromCache: true });
    await this.run(ctx.drain());
  }

  /** `read`'s answer from the state's Redis; null where Redis failed, said through the state's
   * outage. */
  private async fromRedis<T>(read: () => Promise<T>): Promise<{ value: T } | null> {
    const ctx = this.ctx;
    try {
      reachable(ctx.redis);
      return { value: await read() };
    } catch (exc) {
      if (!failedInRedis(exc)) throw exc;
      ctx.redisFailed(ctx.stateOutage, exc);
      return null;
    }
  }

  private async load(key: string, loadId: number): Promise<void> {
    const ctx = this.ctx;
    const read = await this.fromRedis(() => ctx.redis.hgetall(key));
    if (read === null) {
      ctx.core.handle({ kind: "LoadFailed", key, loadId });
      return;
    }
    ctx.redisAnswered(ctx.stateOutage);
    ctx.core.handle({ kind: "IdentityLoaded", key, fields: read.value, loadId });
  }

  /** HKEYS of each key the core names (state hashes, then the cold buckets' events hashes), in
   * one round trip. */
  private async listPending(tag: number, keys: string[]): Promise<void> {
    const ctx = this.ctx;
    const read = await this.fromRedis(async () => {
      const fields = new Map<string, unknown[]>();
      if (ctx.cluster !== null) {
        const replies = await Promise.all(keys.map((key) => ctx.redis.hkeys(key)));
        keys.forEach((key, i) => fields.set(key, replies[i] as unknown[]));
        return fields;
      }
      const pipeline = ctx.redis.pipeline();
      for (const key of keys) pipeline.hkeys(key);
      const replies = (await pipeline.exec()) ?? [];
      keys.forEach((key, i) => {
        const [error, names] = replies[i] ?? [new Error("no reply"), null];
        if (error) throw error;
        fields.set(key, names as unknown[]);
      });
      return fields;
    });
    if (read === null) {
      ctx.core.handle({ kind: "ListFailed", tag });
      return;
    }
    ctx.redisAnswered(ctx.stateOutage);
    ctx.core.handle({ kind: "PendingListed", tag, fields: read.value });
  }
}
