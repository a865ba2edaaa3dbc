/** Applying Polar's figures (a poll's, a probe's, a webhook's) to a customer meter's state hash,
 * for the public mode (publicMode.ts), as the Python drivers do (outpost_async/_anchors.py).
 *
 * Applying a figure reads the state hash and the identity's pending events, lets the core decide
 * (core/publicAnchoring.ts: the prune rule), and runs apply_anchor.lua with the revision it read.
 * A track, an acknowledgement or another instance's anchor that lands in between moves the
 * revision: the script writes nothing and the figure is read and decided again, a few times; one
 * lost to conflicts every time is counted, and the next poll brings it again. */

import { InvalidWebhook, UsageError } from "../core/errors.js";
import { Customer, FLEET_TAG, ackedKey, bucketKey, channel, encodeComponent, stateKey } from "../core/keys.js";
import { type Anchoring, type Mode, anchor } from "../core/publicAnchoring.js";
import type { Outcome, PolarReading } from "../core/publicLedger.js";
import { parseStateChanged } from "../core/publicReadings.js";
import { verify } from "../core/webhookSignature.js";
import { redisUnavailable } from "./connections.js";
import type { Headers, PublicHooks } from "./publicMode.js";

/** Reads and decisions of one figure before it is given up to conflicts (the next poll brings
 * it again). */
export const ATTEMPTS = 5;
/** A delivery id is remembered for a day: Polar retries for less. */
const WEBHOOK_TTL_MS = 86_400_000;
const CONFLICT = '{"conflict":';

/** What the core decides of a state hash and its pending events (a figure, a probe's answer). */
export type Decide = (aggregation: string, fields: Record<string, string>, events: Record<string, string>) => Anchoring;

export class Anchors {
  /** Figures applied, by outcome (first, accepted, rejected, reset, stale, no_watermark; probes
   * probed, probe_rejected, probe_unused), and conflicts given up. */
  readonly outcomes = new Map<string, number>();
  /** State key -> the figure being applied to it (the next waits for it). */
  private readonly applying = new Map<string, Promise<Outcome | null>>();

  constructor(
    private readonly hooks: PublicHooks,
    /** How long before a figure's modified_at an acknowledged event may still be missing from
     * it, in µs. */
    readonly marginUs: number,
    /** The webhook endpoint's secret, decoded (null: none was given). */
    private readonly key: Uint8Array | null,
  ) {}

  /** Apply one figure to the customer's state for its meter (null: the meter is not in the
   * configuration, the figure was lost to conflicts, or `existing` asked for an identity whose
   * state Redis holds, and it holds none: nobody follows it). Rejects with RedisUnavailable. */
  async apply(customer: Customer, reading: PolarReading, existing = false): Promise<Outcome | null> {
    return this.write(customer, reading.meterId, existing, (func, fields, events) => anchor(func, this.marginUs, fields, events, reading));
  }

  /** Read, let the core decide, and run apply_anchor.lua with the revision read. */
  async write(customer: Customer, meterId: string, existing: boolean, decide: Decide): Promise<Outcome | null> {
    const core = this.hooks.core;
    const reducer = core.configuration?.reducerFor(meterId) ?? null;
    if (reducer === null || !reducer.aggregation.bucketed()) return null;
    const state = stateKey(customer, reducer.id, this.hooks.core.shards);
    // One write of a customer meter at a time on this instance: figures applied at once (a
    // burst of webhooks) would only make each other read again.
    const before = this.applying.get(state);
    const func = reducer.aggregation.func;
    const turn = (before ?? Promise.resolve()).then(
      () => this.writeNow(customer, existing, state, func, decide),
      () => this.writeNow(customer, existing, state, func, decide),
    );
    this.applying.set(state, turn);
    try {
      return await turn;
    } finally {
      if (this.applying.get(state) === turn) this.applying.delete(state);
    }
  }

  private async writeNow(customer: Customer, existing: boolean, state: string, aggregation: string, decide: Decide): Promise<Outcome | null> {
    const core = this.hooks.core;
    const shardChannel = channel(core.shardOf(customer), core.settings.channelNamespace);
    for (let attempt = 0; attempt < ATTEMPTS; attempt++) {
      const [fields, events] = await this.read(state);
      if (existing && Object.keys(fields).length === 0) return null;
      const decided = decide(aggregation, fields, events);
      for (const problem of decided.problems) core.reject("public", `${state}: ${problem}`);
      if (decided.write === null) {
        this.count(decided.outcome);
        return decided.outcome;
      }
      const args = decided.write.args(shardChannel, core.knownRev(state));
      const reply = await this.hooks.script("apply_anchor", [state, ackedKey(state)], args);
      if (typeof reply === "string" && reply.startsWith(CONFLICT)) continue; // the revision moved: read and decide again
      core.handle({ kind: "ScriptReplied", reply, tag: null }); // its echo is dropped when it comes
      await this.hooks.run(this.hooks.drain());
      this.count(decided.outcome);
      return decided.outcome;
    }
    this.count("conflicts");
    return null;
  }

  private count(what: string): void {
    this.outcomes.set(what, (this.outcomes.get(what) ?? 0) + 1);
  }

  /** The state hash and every pending event of the identity (events field -> value). */
  async read(state: string): Promise<[Record<string, string>, Record<string, string>]> {
    const redis = this.hooks.redis;
    try {
      const fields = await redis.hgetall(state);
      const buckets = Object.keys(fields).filter((name) => name.startsWith("a:")).map((name) => name.slice(2));
      const replies = await Promise.all(buckets.map((bucket) => redis.hgetall(bucketKey(state, bucket))));
      return [fields, Object.assign({}, ...replies) as Record<string, string>];
    } catch (exc) {
      throw redisUnavailable(`reading ${state}`, exc, redis);
    }
  }


  /** Verify a webhook delivery, take it once for the fleet, apply the figures it carries to the
   * identities some instance follows; resolve to the HTTP status to answer. Verified in every
   * mode; applied only in the public one (204 in the snapshot protocol, 503 while auto has not
   * found out which runs: Polar delivers it again). */
  async handleWebhook(body: Uint8Array, headers: Headers, mode: Mode): Promise<number> {
    const hooks = this.hooks;
    if (this.key === null) {
      throw new UsageError("handleWebhook() needs the endpoint's secret: the webhookSecret option or the environment variable POLAR_WEBHOOK_SECRET");
    }
    if (!(body instanceof Uint8Array)) throw new UsageError("handleWebhook() takes the request's body as bytes (a Buffer), unparsed");
    const verdict = verify(this.key, plainHeaders(headers), body, hooks.nowUs() / 1e6);
    if (!verdict.genuine) {
      hooks.core.rejections.set("webhook", (hooks.core.rejections.get("webhook") ?? 0) + 1);
      hooks.log.warn(`outpost refused a webhook delivery: ${verdict.reason}`);
      throw new InvalidWebhook(`webhook refused: ${verdict.reason}`);
    }
    if (mode === "auto") return 503; // the mode is not known yet: Polar delivers it again later
    if (mode === "snapshots") return 204; // snapshots bring the figures: taken, nothing applied
    if (hooks.core.configuration === null) return 503; // no meter known yet: Polar delivers it again later
    const taken = `${FLEET_TAG}webhook:${encodeComponent(verdict.messageId)}`;
    try {
      if ((await hooks.redis.set(taken, "1", "PX", WEBHOOK_TTL_MS, "NX")) === null) return 204; // another instance (or this one) took it already
    } catch (exc) {
      throw redisUnavailable("taking a webhook delivery", exc, hooks.redis);
    }
    const [readings, rejected] = parseStateChanged(body);
    for (const problem of rejected) hooks.core.reject("webhook", problem.reason);
    try {
      for (const reading of readings) {
        for (const customer of identities(reading)) await this.apply(customer, reading, true);
      }
    } catch (exc) {
      // Not applied: let Polar's retry bring it again (to this instance or another).
      await hooks.redis.del(taken).catch(() => {});
      throw exc;
    }
    return 204;
  }
}

/** The names a reading gives its customer: by external id, by Polar's id, or both. */
export function identities(reading: PolarReading): Customer[] {
  const out: Customer[] = [];
  if (reading.externalCustomerId !== null) out.push(new Customer("external", reading.externalCustomerId));
  if (reading.customerId !== null) out.push(new Customer("customer", reading.customerId));
  return out;
}

/** Headers as Node gives them (a repeated one as a list) as the verifier reads them. */
function plainHeaders(headers: Headers): Record<string, string | undefined> {
  const out: Record<string, string | undefined> = {};
  for (const [name, value] of Object.entries(headers)) out[name] = Array.isArray(value) ? value.join(" ") : value;
  return out;
}
