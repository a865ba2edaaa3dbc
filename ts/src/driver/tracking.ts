/** Writing one event: the core's track script (once Polar's configuration came), run with its
 * ticket (its echo may come first), and the durability wait where it is asked for. Exact
 * admission (reservation.ts) runs its scripts the same way. */

import type { RunScript } from "../core/effects.js";
import { NotDurable, NotReady } from "../core/errors.js";
import type { TrackArgs } from "../core/session.js";
import { reachable, redisUnavailable } from "./connections.js";
import { type DriverContext, SETTLE } from "./context.js";
import { WaitFailed } from "./durable.js";
import type { SessionEffects } from "./effects.js";
import type { TrackOptions } from "./outpost.js";
import { runScript } from "./scripts.js";
import { monotonic } from "./signal.js";
import { trackArgsOf } from "./trackArgs.js";

export class Tracking {
  constructor(
    private readonly ctx: DriverContext,
    private readonly effects: SessionEffects,
  ) {}

  /** Write the event; its id and the script that wrote it. */
  async trackNow(name: string, options: TrackOptions): Promise<[string, RunScript]> {
    const ctx = this.ctx;
    const args = trackArgsOf(name, options, ctx.nowUs());
    const eventId = args.eventId;
    const run = await this.trackScript(args);
    const shortfall = await this.writeScript(run, (reply, ticket) => {
      ctx.core.handle({ kind: "ScriptReplied", reply, tag: null, ticket });
    });
    const effects = ctx.drain();
    if (effects.length) await this.effects.run(effects);
    if (shortfall !== null) throw new NotDurable(`event ${eventId} is on the primary only: ${shortfall}`, eventId);
    return [eventId, run];
  }

  /** Run a script that writes a customer's state (track, admission), waiting for a replica when
   * durability asks. The core gives it a ticket (its echo may come before its reply: the core
   * holds what comes meanwhile); `replied` gets its reply and that ticket as soon as the reply
   * comes (before WAIT's answer), for the core. A script that never replied ends its ticket as
   * failed (the core applies what it held for it). Resolves to why the write is less durable than
   * asked (null: it is not); a failure of the script rejects with RedisUnavailable. */
  async writeScript(run: RunScript, replied: (reply: unknown, ticket: number) => void): Promise<string | null> {
    const ctx = this.ctx;
    const ticket = ctx.core.scriptSent();
    let ended = false;
    const end = (reply: unknown): void => {
      ended = true;
      replied(reply, ticket);
    };
    try {
      const wait = ctx.durability.wait();
      if (wait === null) {
        end(await runScript(ctx.redis, run.script, run.keys, run.args));
        return null;
      }
      let answer: unknown;
      try {
        reachable(ctx.redis);
        answer = await ctx.durable.run(run.script, run.keys, run.args, wait, end);
      } catch (exc) {
        throw redisUnavailable(`running ${run.script}`, exc, ctx.redis);
      }
      // The script replied and its connection broke before WAIT answered: written, maybe not copied.
      return answer instanceof WaitFailed ? `WAIT failed: ${answer.reason}` : ctx.durability.shortfall(answer);
    } finally {
      if (!ended) ctx.core.handle({ kind: "ScriptFailed", tag: null, ticket });
    }
  }

  /** The core's track script for `args`; before Polar's configuration came, it waits for it
   * first (up to snapshotTimeout). */
  async trackScript(args: TrackArgs): Promise<RunScript> {
    try {
      return this.ctx.core.track(args);
    } catch (exc) {
      if (!(exc instanceof NotReady)) throw exc;
      await this.waitForConfiguration();
      return this.ctx.core.track(args);
    }
  }

  private async waitForConfiguration(): Promise<void> {
    const ctx = this.ctx;
    const deadline = monotonic() + ctx.core.settings.snapshotTimeout;
    while (ctx.core.configuration === null) {
      const remaining = deadline - monotonic();
      if (remaining <= 0) {
        const [state, error] = ctx.core.linkStatus();
        let reason = `no configuration from Polar yet (WebSocket ${state}${error ? `: ${error}` : ""})`;
        if (ctx.public.mode !== "snapshots") reason = ctx.public.notReadyReason(reason, "");
        throw new NotReady(`${reason}: cannot tell which meters count the event${ctx.redisCause()}`);
      }
      const version = ctx.signal.version;
      await this.effects.readCachedConfiguration();
      await ctx.signal.wait(version, Math.min(remaining, SETTLE));
    }
  }
}
