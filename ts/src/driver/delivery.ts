/** The delivery loops: each drives one Delivery machine (core/delivery.ts), running the one
 * effect it asks for at a time and handing back the answer; actOnce() is their dispatch table.
 * Redis failures go to the instance's DeliveryRecovery, which says what a loop does next; a
 * closing instance hands its entries back. */

import type { Cluster, Redis } from "ioredis";
import { Delivery, type DeliveryAnswer, type DeliveryEffect, GROUP, type OutboxRead, type PostAndSettle, type ReadOutbox, type SettleScript, nothingDone, withKnownRevs } from "../core/delivery.js";
import { type AfterFailure, lostItsData } from "../core/deliveryRecovery.js";
import { type ForgetHeartbeat, handBack } from "../core/liveness.js";
import { describe, together, watched } from "./connections.js";
import { type DriverContext, POLL, errorText } from "./context.js";
import type { SessionEffects } from "./effects.js";
import { post } from "./ingest.js";
import { logError } from "./logger.js";
import { OutboxReads, createGroups, pairs } from "./outbox.js";
import { failedInRedis } from "./redisFailure.js";
import { runScript } from "./scripts.js";
import { monotonic } from "./signal.js";
import { supervised } from "./supervisor.js";

/** What changes this consumer's pending entries as a read does: a re-read of them waits while a
 * loop does one. (A ReadOutbox counts itself, once it knows which read it does.) */
const MOVES_ENTRIES = new Set<DeliveryEffect["kind"]>(["ClaimStale", "Reclaim", "SettleScript", "SettleScripts", "PostAndSettle"]);
const SETTLED: DeliveryAnswer = { kind: "Settled", reply: null };

export class Deliveries {
  private readonly reads: OutboxReads;

  constructor(
    private readonly ctx: DriverContext,
    private readonly effects: SessionEffects,
  ) {
    this.reads = new OutboxReads(ctx);
  }

  /** Start `maxInFlight` delivery loops, each under the supervisor; their workers. */
  start(): Promise<void>[] {
    const ctx = this.ctx;
    const workers: Promise<void>[] = [];
    for (let n = 0; n < ctx.maxInFlight; n++) {
      ctx.deliveries.push(this.machine(n));
      // A blocking XREADGROUP needs a connection of its own: ioredis pipelines one socket. On a
      // cluster, reads do not block (one per stream): the shared client serves.
      const connection = ctx.cluster ?? watched((ctx.redis as Redis).duplicate());
      if (connection !== ctx.redis) ctx.connections.push(connection);
      workers.push(
        supervised(ctx, `delivery ${n}`, (restarted) => {
          if (restarted) {
            // A fresh machine; what the failed one held is still pending for this consumer,
            // and is read again.
            ctx.deliveries[n] = this.machine(n);
            ctx.recovery.restarted(n);
          }
          return this.loop(ctx.deliveries[n] as Delivery, connection, n);
        }),
      );
    }
    return workers;
  }

  private machine(n: number): Delivery {
    const ctx = this.ctx;
    const started = monotonic();
    return ctx.traces.delivery(n, new Delivery(ctx.deliverySettings, ctx.traces.rng(n + 1), started), ctx.deliverySettings, started);
  }

  private async loop(delivery: Delivery, connection: Redis | Cluster, number: number): Promise<void> {
    const ctx = this.ctx;
    await this.retrying(number, () => createGroups(ctx, connection), undefined, connection); // Redis may be down at start
    while (!ctx.closed) {
      const flushing = ctx.flushing > 0;
      if (flushing !== delivery.flushing) delivery.handle({ kind: "Flushing", on: flushing });
      delivery.handle({ kind: "Tick", now: monotonic(), wallUs: ctx.nowUs() });
      const [action] = delivery.effects() as [DeliveryEffect]; // one effect a drain
      const moves = MOVES_ENTRIES.has(action.kind);
      if (moves) ctx.recovery.readStarted(); // a re-read of this consumer's entries waits meanwhile
      let outcome: DeliveryAnswer;
      try {
        outcome = await this.act(action, connection, number);
      } finally {
        if (moves) ctx.recovery.readEnded();
      }
      delivery.handle({ kind: "Tick", now: monotonic(), wallUs: ctx.nowUs() });
      delivery.handle(outcome);
      for (const report of delivery.reports()) ctx.logReport(report);
      if (outcome.kind === "Settled" || action.kind === "PostAndSettle") {
        ctx.signal.fire(); // the ticks, and reads waiting on this instance's copies
        ctx.deliveryWake.fire(); // a flush waiting; a loop holding off its re-read until none holds
      }
    }
  }

  /** Do one delivery action. Redis failures are retried until they succeed (or the instance
   * closes): settling must not be skipped, and a read can simply wait. */
  act(action: DeliveryEffect, connection: Redis | Cluster, number: number): Promise<DeliveryAnswer> {
    if (action.kind === "PostAndSettle") return this.postAndSettle(action, connection, number);
    if (action.kind === "SettleScripts") return this.settleAll(action.settles, connection, number).then(() => SETTLED);
    const nothing: DeliveryAnswer =
      action.kind === "PostBatch"
        ? { kind: "BatchFailed", reason: "closing", maybeSent: false }
        : action.kind === "ReportDropped"
          ? { kind: "Reported" }
          : nothingDone(action);
    return this.retrying(number, () => this.actOnce(action, connection, number), nothing, connection);
  }

  /** The next batch's post, and meanwhile the read of the batch after it (if asked) and the settle
   * scripts of the batches before it, each retried until Redis answers (never the post: it changes
   * nothing in Redis). */
  private async postAndSettle(action: PostAndSettle, connection: Redis | Cluster, number: number): Promise<DeliveryAnswer> {
    const ask = action.read ?? null;
    // The read first: the loop needs it as soon as the post returns. The settle scripts go in
    // the same write, right behind it: Redis runs them while this process reads what the read
    // found, rather than wait for their commands.
    const meanwhile = (): Promise<OutboxRead | null> =>
      together(connection, () => {
        const found = ask === null ? Promise.resolve(null) : this.readAlongside(ask, connection, number);
        return allEnded([found, this.settleAll(action.settles, connection, number)]).then(() => found);
      });
    // Both end before a failure of one ends the loop: nothing of a failed loop is left in flight
    // when its restart re-reads this consumer's pending entries.
    const work = [post(this.ctx, action.post.body), meanwhile()] as const;
    await allEnded(work);
    const [answer, found] = await Promise.all(work);
    return found === null ? answer : { kind: "PostedAlongside", answer, read: found };
  }

  /** A read beside a post, tried once: on a Redis failure it found nothing, and what it may have
   * taken is read again from this consumer's pending entries later. */
  private async readAlongside(action: ReadOutbox, connection: Redis | Cluster, number: number): Promise<OutboxRead> {
    try {
      return await this.reads.readOutbox(action, connection);
    } catch (exc) {
      if (!failedInRedis(exc)) throw exc;
      const ctx = this.ctx;
      ctx.logReport(ctx.recovery.readBesidePostFailed(number, monotonic(), errorText(exc, connection), Math.random(), { closing: ctx.closed }));
      return { kind: "OutboxRead", entries: [] };
    }
  }

  /** Every script of `settles`, at once (their commands go out together, in one write), each
   * retried until Redis answers; a bug in one throws once the others ended. */
  private async settleAll(settles: SettleScript[], connection: Redis | Cluster, number: number): Promise<void> {
    const all = together(connection, () => settles.map((settle) => this.retrying(number, () => this.actOnce(settle, connection, number), SETTLED, connection)));
    await allEnded(all);
  }

  /** call() until Redis answers, doing what the instance's recovery says after each failure of
   * delivery loop `loop` in Redis; `closing` (nothing done, the work stays queued in Redis) once it
   * gives up. Anything else call() throws is a bug of ours, thrown on (the loop's supervisor logs
   * it and restarts the loop, which reads this consumer's pending entries again). */
  private async retrying<T>(loop: number, call: () => Promise<T>, closing: T, client: Redis | Cluster): Promise<T> {
    const ctx = this.ctx;
    for (;;) {
      let result: T;
      try {
        result = await call();
      } catch (exc) {
        if (!failedInRedis(exc)) throw exc; // a bug of ours: the loop's supervisor logs it and restarts the loop
        const options = { lostData: lostItsData(String(exc)), closing: ctx.closed };
        const after = ctx.recovery.failed(loop, monotonic(), errorText(exc, client), Math.random(), options);
        if (after.kind === "GiveUp") return closing;
        await this.afterFailure(after);
        continue;
      }
      ctx.logReport(ctx.recovery.answered(loop, monotonic()));
      return result;
    }
  }

  private async afterFailure(after: Exclude<AfterFailure, { kind: "GiveUp" }>): Promise<void> {
    const ctx = this.ctx;
    if (after.kind === "RecreateGroups") {
      await createGroups(ctx, ctx.redis).catch((exc: unknown) => {
        if (!failedInRedis(exc)) throw exc; // (Redis failing: the next try meets it again)
      });
    } else {
      ctx.logReport(after.report);
    }
    await ctx.pause(after.seconds);
  }

  /** Once the loops stopped: this instance's heartbeat goes, so other instances take what it
   * still holds at their next survey, and it leaves the group where it holds nothing. */
  async handBack(connection: Redis | Cluster): Promise<void> {
    const ctx = this.ctx;
    try {
      for (const action of handBack(ctx.consumer, ctx.shards)) await this.actOnce(action, connection);
    } catch (exc) {
      if (!failedInRedis(exc)) return ctx.bug("handing back the outbox entries", exc);
      ctx.log.warn(`outpost could not hand back its outbox entries (others take them once its heartbeat expires): ${describe(exc, connection)}`);
    }
  }

  /** One effect of a delivery machine (or of the hand-back), tried once. */
  private async actOnce(action: DeliveryEffect | ForgetHeartbeat, connection: Redis | Cluster, number = -1): Promise<DeliveryAnswer> {
    const ctx = this.ctx;
    switch (action.kind) {
      case "ReadOutbox":
        return this.reads.readOutbox(action, connection);
      case "PostBatch":
        return post(ctx, action.body);
      case "PostAndSettle": // (a loop runs these through act())
        return this.postAndSettle(action, connection, Math.max(number, 0));
      case "SettleScripts":
        return this.settleAll(action.settles, connection, Math.max(number, 0)).then(() => SETTLED);
      case "SettleScript": {
        // Told which revisions this instance holds, the script replies with what changed, so
        // this instance's copies (and a flush() waiting on them) see it at once.
        const call = withKnownRevs(action, (state) => ctx.core.knownRev(state));
        ctx.settling += 1;
        try {
          const reply = await runScript(connection, call.script, call.keys, call.args);
          ctx.core.handle({ kind: "ScriptReplied", reply, tag: null });
          await this.effects.run(ctx.drain());
          return { kind: "Settled", reply };
        } finally {
          ctx.settling -= 1;
        }
      }
      case "ReportDropped":
        if (ctx.onDropped === null) {
          logError(ctx.log, `outpost dropped ${action.events.length} events: ${action.reason}`); // usage Polar will not bill
        } else {
          try {
            await ctx.onDropped([...action.events], action.reason);
          } catch (exc) {
            logError(ctx.log, `outpost: onDropped threw ${String(exc)}`);
          }
        }
        return { kind: "Reported" };
      case "RefreshClaim": {
        const byStream = new Map<string, string[]>();
        for (const [stream, id] of action.entries) byStream.set(stream, [...(byStream.get(stream) ?? []), id]);
        for (const [stream, ids] of byStream) await connection.call("XCLAIM", stream, GROUP, ctx.consumer, 0, ...ids, "JUSTID");
        return { kind: "Done" };
      }
      case "ClaimStale": {
        const entries: [string, string, Map<string, string>][] = [];
        for (const stream of ctx.outboxes) {
          const reply = (await connection.call("XAUTOCLAIM", stream, GROUP, ctx.consumer, Math.trunc(action.minIdle * 1000), "0-0", "COUNT", action.count)) as [string, [string, string[] | null][]];
          for (const [id, flat] of reply[1] ?? []) if (Array.isArray(flat)) entries.push([stream, id, pairs(flat)]);
        }
        return { kind: "OutboxRead", entries };
      }
      case "Sleep": {
        const version = ctx.deliveryWake.version;
        await ctx.deliveryWake.wait(version, Math.min(action.until - monotonic(), POLL));
        return { kind: "Done" };
      }
      case "Beat":
        await connection.set(action.key, "1", "PX", action.ttlMs);
        return { kind: "Done" };
      case "SurveyConsumers": {
        const listing: [string, unknown][] = [];
        for (const stream of ctx.outboxes) listing.push([stream, await connection.xinfo("CONSUMERS", stream, GROUP)]);
        return { kind: "ConsumersListed", listing };
      }
      case "CheckHeartbeats": {
        // One MGET, on a cluster too: every heartbeat key has the fleet's hash tag, so one slot.
        return { kind: "HeartbeatsChecked", values: await connection.mget(...action.keys) };
      }
      case "Reclaim": {
        const reply = await runScript(connection, "reclaim", [action.stream], [GROUP, action.taker, String(action.count), ...action.consumers], true);
        return { kind: "Reclaimed", stream: action.stream, reply };
      }
      case "TakeRequest": {
        // "": Redis's clock
        const reply = await runScript(connection, "budget", [action.key], [String(action.perMinute), String(action.capacity), ""], true);
        return { kind: "BudgetAnswered", reply };
      }
      case "ForgetHeartbeat":
        await connection.del(action.key);
        return { kind: "Done" };
    }
  }
}

/** Resolves once every one of `work` settled; then rejects with the first failure, if any. */
async function allEnded(work: readonly Promise<unknown>[]): Promise<void> {
  const failed = (await Promise.allSettled(work)).find((outcome) => outcome.status === "rejected");
  if (failed !== undefined) throw failed.reason;
}
