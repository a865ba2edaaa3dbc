/** The Outpost client for Node: a thin driver that moves replies and messages between Redis,
 * Polar and the sans-IO core (../core), and runs the effects the core asks for. It mirrors the
 * Python SDK's AsyncOutpost method for method: track(), balance(), flush(), close().
 *
 * JavaScript runs one callback at a time, so the core needs no lock: each call into it runs to
 * its end before any other input is handed to it.
 *
 * This module holds the public class and its options; the parts it is made of share one
 * DriverContext (context.ts): the effect runner (effects.ts, websocket.ts), the change
 * subscription (subscriber.ts, cluster.ts), the delivery loops (delivery.ts, outbox.ts,
 * ingest.ts), flush (flushing.ts), the reads and writes (reads.ts, tracking.ts), the lifecycle and
 * its loops (lifecycle.ts, ticks.ts, supervisor.ts), the public mode (publicMode.ts). */

import type { Cluster, Redis } from "ioredis";
import type { Balance } from "../core/balance.js";
import type { DurabilityName } from "../core/durability.js";
import { InvalidEvent, NotReady, OutpostClosed, RedisUnavailable } from "../core/errors.js";
import type { Mode } from "../core/publicAnchoring.js";
import { type DriverContext, USER_AGENT, openContext, warnCleartext } from "./context.js";
import { Deliveries } from "./delivery.js";
import { SessionEffects } from "./effects.js";
import { flushOutboxes } from "./flushing.js";
import { Lifecycle } from "./lifecycle.js";
import type { Logger } from "./logger.js";
import { type Headers, PublicMode } from "./publicMode.js";
import { Reads } from "./reads.js";
import { type AdmissionHooks, type Reservation, reserveUnits, trackAdmitted } from "./reservation.js";
import { runScript } from "./scripts.js";
import { customerAttribute } from "./telemetry.js";
import { Tracking } from "./tracking.js";

export { DEFAULT_REDIS_URL, DEFAULT_SERVER_URL } from "./context.js";

export type DroppedCallback = (events: unknown[], reason: string) => unknown;

export interface Clock {
  now(): Date;
}

export interface OutpostOptions {
  /** Polar organization access token (default: env POLAR_ACCESS_TOKEN). */
  accessToken?: string;
  /** Redis to keep the state in (default: env REDIS_URL, else local Redis); `redis+cluster://host:port`
   * (`rediss+cluster://` with TLS) names a Redis Cluster by any of its nodes. */
  redisUrl?: string;
  /** An existing ioredis client to use instead of redisUrl; close() does not close it. */
  redis?: Redis | Cluster;
  /** Polar's API (default: env POLAR_SERVER_URL, else https://api.polar.sh). */
  serverUrl?: string;
  /** Seconds a first read waits for Polar's snapshot before NotReady. */
  snapshotTimeout?: number;
  /** The most customers this process follows in memory (about 5 KB each; default 16,000);
   * beyond it the least recently read is let go, and Polar told to forget it. */
  maxCustomers?: number;
  /** Seconds without a read after which a customer is let go (default 900). */
  idleCustomerTtl?: number;
  /** Ingestion requests every instance sharing the Redis may send a minute together (a token
   * bucket in Redis); 0 turns the shared budget off. */
  requestsPerMinute?: number;
  /** Seconds an instance stays alive for the others without a sign of life from its delivery
   * loop (refreshed four times as often); events held by a dead one are taken over at once. */
  heartbeat?: number;
  /** Most bytes of one ingestion request body (Polar refuses over 10 MiB). */
  batchBytes?: number;
  /** Deliveries of a batch before its events are dropped. */
  maxAttempts?: number;
  /** Called with the events Polar will never count, and why. */
  onDropped?: DroppedCallback;
  /** false (or env POLAR_OUTPOST_TELEMETRY=0) records nothing. */
  telemetry?: boolean;
  /** Where event timestamps come from. */
  clock?: Clock;
  /** Ingestion requests this instance may have open at once. */
  maxInFlight?: number;
  batchSize?: number;
  linger?: number;
  claimIdle?: number;
  retryBase?: number;
  logger?: Logger;
  /** Where telemetry is exported (Polar's relay; default: serverUrl) and every how many seconds. */
  telemetryUrl?: string;
  telemetryInterval?: number;
  /** Also record into the application's global OpenTelemetry providers. Off by default: the
   * records name the meter and the customer (often an email), one series each. */
  telemetryToApp?: boolean;
  /** How Polar is followed: "snapshots" (the snapshot protocol on /v1/outpost/), "public" (Polar's
   * public API: polls and webhooks, docs/public-mode.md), or "auto" (the default): the snapshot
   * protocol where Polar serves it, the public API where /v1/outpost/ answers 404. */
  mode?: Mode;
  /** The public mode's webhook endpoint secret, whsec_... (default: env POLAR_WEBHOOK_SECRET). */
  webhookSecret?: string;
  /** Seconds before a figure's modified_at within which an acknowledged event may still be
   * missing from it (the public mode; default 60). */
  publicMargin?: number;
  /** Seconds between two polls of a customer meter in the public mode (default 300). */
  pollInterval?: number;
  /** A directory to write conformance traces to (session.jsonl, delivery-<n>.jsonl): every input
   * of the core and its answers, replayable by this core and the Python one. Debugging only. */
  recordTo?: string;
  /** The deployment's shard count (default 16): every instance sharing the Redis uses the same.
   * The first instance stores it in Redis; an instance configured with another refuses to start
   * (ConfigurationError). More than 16 spread the load over more than 16 Redis Cluster primaries
   * (docs/redis-layout.md). */
  shards?: number;
  /** When track() resolves: "primary" (the default) once the primary ran its script; "replica"
   * once a replica acknowledged the event too (`WAIT 1` on the same connection, in the same round
   * trip), so a fail-over keeps it. When none acknowledges within durabilityTimeout, track()
   * rejects with NotDurable: the event is written and counts, and a retry with its eventId (the
   * error's) writes nothing twice. reserve(), a commit and a requireBalance track wait too. */
  durability?: DurabilityName;
  /** Seconds durability "replica" waits for a replica before NotDurable (default 1.0). */
  durabilityTimeout?: number;
}

export interface TrackOptions {
  externalCustomerId?: string;
  customerId?: string;
  metadata?: Record<string, unknown>;
  timestamp?: Date;
  eventId?: string;
  /** Record the event only if every meter it counts in has the available balance (every
   * instance's holds and events) to cover its value, atomically; else InsufficientBalance and
   * nothing is written. */
  requireBalance?: boolean;
}

export interface ReserveOptions {
  externalCustomerId?: string;
  customerId?: string;
  /** Seconds until the hold expires on its own (default 60). */
  ttl?: number;
}

export interface CustomerOptions {
  externalCustomerId?: string;
  customerId?: string;
  /** Read Redis, never memory: the answer counts everything any instance tracked before the
   * call (one round trip; Balance.source is "redis"). */
  fresh?: boolean;
}


export class Outpost {
  /** What the parts share (tests look inside: ctx.deliveries, ctx.connections, ctx.core...). */
  private readonly ctx: DriverContext;
  private readonly effects: SessionEffects;
  private readonly delivery: Deliveries;
  private readonly lifecycle: Lifecycle;
  private readonly reads: Reads;
  private readonly tracking: Tracking;

  constructor(options: OutpostOptions = {}) {
    const [ctx, publicOptions] = openContext(options); // the options checked before any connection opens
    const effects = new SessionEffects(ctx);
    ctx.public = new PublicMode(
      {
        core: ctx.core,
        redis: ctx.redis,
        signal: ctx.signal,
        log: ctx.log,
        serverUrl: ctx.serverUrl,
        accessToken: ctx.accessToken,
        userAgent: USER_AGENT,
        closing: ctx.closing.signal,
        closed: () => ctx.closed,
        script: (name, keys, args) => runScript(ctx.redis, name, keys, args),
        run: (effects_) => effects.run(effects_),
        drain: () => ctx.drain(),
        pause: (seconds) => ctx.pause(seconds),
        nowUs: () => ctx.nowUs(),
      },
      publicOptions,
    );
    warnCleartext(ctx, options);
    this.ctx = ctx;
    this.effects = effects;
    this.delivery = new Deliveries(ctx, effects);
    this.lifecycle = new Lifecycle(ctx, effects, this.delivery);
    this.reads = new Reads(ctx, effects, () => this.ensureStarted());
    this.tracking = new Tracking(ctx, effects);
  }

  // -- lifecycle ------------------------------------------------------------------------------

  /** Start the background work (the first call of any method does it too). */
  async start(): Promise<this> {
    await this.ensureStarted();
    return this;
  }

  private ensureStarted(): Promise<void> {
    return this.lifecycle.ensureStarted();
  }

  /** Deliver every event queued when the call started, by any instance. Resolves true once each
   * was delivered or dropped (and reported), false if some were still queued after `timeout`
   * seconds (they stay queued, nothing is lost). Rejects with RedisUnavailable when Redis
   * cannot be read. */
  async flush(timeout = 10.0): Promise<boolean> {
    await this.ensureStarted();
    return flushOutboxes(this.ctx, timeout);
  }

  /** Flush, stop the background work and release connections, within `timeout` seconds
   * whatever is down (what is not delivered stays queued in Redis for the next instance). Safe
   * to call twice. */
  async close(timeout = 10.0): Promise<void> {
    await this.lifecycle.close(timeout, (left) => this.flush(left));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** Why delivery to Polar is stalled (a rejected token, a wrong URL), or null. */
  get deliveryStalled(): string | null {
    return this.ctx.deliveries.find((d) => d.stalled)?.stalled ?? null;
  }

  /** How Polar is followed: "snapshots" (the snapshot protocol), "public" (Polar's public API:
   * polls and webhooks), or "auto" while the instance has not found out yet. */
  get mode(): Mode {
    return this.ctx.public.mode;
  }

  /** Why this mode runs (asked for, or what Polar answered on /v1/outpost/). */
  get modeReason(): string {
    return this.ctx.public.reason;
  }

  /** The public mode: verify a webhook delivery from Polar (its raw body, unparsed, and its
   * headers), take it once for every instance sharing the Redis, and apply the customer meters
   * it carries; resolve to the HTTP status to answer Polar with. Rejects with InvalidWebhook
   * when the signature does not hold (answer 401), UsageError without the endpoint's secret,
   * RedisUnavailable. */
  async handleWebhook(body: Uint8Array, headers: Headers): Promise<number> {
    await this.ensureStarted();
    return this.ctx.public.handleWebhook(body, headers);
  }

  /** Whether the WebSocket to Polar is open. */
  get connected(): boolean {
    return this.ctx.core.connected;
  }

  /** Whether the copies are following Redis's change channels right now. */
  get subscribed(): boolean {
    return this.ctx.core.subscribed;
  }

  /** How many inputs from peers were rejected, by kind (each was logged). */
  get rejections(): Record<string, number> {
    const counts = Object.fromEntries(this.ctx.core.rejections);
    const outbox = this.ctx.deliveries.reduce((n, d) => n + d.rejectedEntries, 0);
    if (outbox) counts.outbox_entry = outbox;
    return counts;
  }

  // -- track ----------------------------------------------------------------------------------

  /** Record one event; resolve to its id (sent to Polar as external_id). When it resolves, the
   * event is in Redis: every read, on every instance sharing the Redis, counts it, and it will
   * reach Polar or be reported to onDropped.
   *
   * Rejects with InvalidEvent (Polar would refuse it; nothing was written), NotReady (no
   * configuration within snapshotTimeout) or RedisUnavailable (a retry with the same eventId is
   * then safe). */
  async track(name: string, options: TrackOptions = {}): Promise<string> {
    if (options.requireBalance) return trackAdmitted(this.admissionHooks(), name, options, true);
    await this.ensureStarted();
    const telemetry = this.ctx.telemetry;
    const started = performance.now();
    const customer = telemetry.enabled ? customerAttribute(options.externalCustomerId, options.customerId) : "";
    try {
      const [eventId, run] = await this.tracking.trackNow(name, options);
      telemetry.tracked(customer, run.meterIds, (performance.now() - started) / 1000, "ok", run.buckets);
      return eventId;
    } catch (exc) {
      const outcome = exc instanceof InvalidEvent ? "invalid" : exc instanceof NotReady ? "not_ready" : exc instanceof RedisUnavailable ? "redis_error" : null;
      if (outcome !== null) telemetry.tracked(customer, [], (performance.now() - started) / 1000, outcome, 0);
      throw exc;
    }
  }

  /** Hold units of the meter for the customer, if its available balance (every instance's holds
   * and events, atomically in Redis) covers them; else reject with InsufficientBalance and hold
   * nothing. Commit the actual usage with Reservation.commit(); the hold expires after ttl
   * seconds. Only count and sum meters take reservations (UnsupportedMeter otherwise). */
  reserve(meterId: string, units: number, options: ReserveOptions = {}): Promise<Reservation> {
    return reserveUnits(this.admissionHooks(), meterId, units, options);
  }

  /** @internal What exact admission (driver/reservation.ts) needs of this instance. */
  admissionHooks(): AdmissionHooks {
    const ctx = this.ctx;
    return {
      core: ctx.core,
      oneSlot: ctx.cluster !== null,
      telemetry: ctx.telemetry,
      ensureStarted: () => this.ensureStarted(),
      trackScript: (args) => this.tracking.trackScript(args),
      writeScript: (run, replied) => this.tracking.writeScript(run, replied),
      run: (effects) => this.effects.run(effects),
      drain: () => ctx.drain(),
      nowUs: () => ctx.nowUs(),
      balance: (meterId, customer) => this.balance(meterId, customer),
    };
  }

  // -- balance --------------------------------------------------------------------------------

  /** The customer's balance of a meter, from memory once warm. The first read of a customer
   * waits for its state (and Polar's snapshot) up to snapshotTimeout; later reads cost no
   * network call. Rejects with NotReady, UnknownMeter or UnsupportedMeter. */
  balance(meterId: string, customer: CustomerOptions = {}): Promise<Balance> {
    // The warm path is not an async function: no frame of its own, one resolved promise.
    const ctx = this.ctx;
    if (ctx.closed) return Promise.reject(new OutpostClosed("this Outpost instance is closed"));
    const external = customer.externalCustomerId ?? null;
    const internal = customer.customerId ?? null;
    const fresh = customer.fresh ?? false;
    const telemetry = ctx.telemetry.enabled;
    const started = telemetry ? performance.now() : 0;
    if (!fresh) {
      const cached = ctx.core.cachedBalance(meterId, external, internal);
      if (cached !== null) {
        if (telemetry) ctx.telemetry.readWarm(meterId, customerAttribute(external, internal));
        return Promise.resolve(cached);
      }
    }
    return this.reads.coldBalance(meterId, external, internal, fresh, started);
  }
}
