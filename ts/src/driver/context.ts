/** What the parts of one Outpost instance share: one DriverContext.
 *
 * The public client (outpost.ts) builds it (openContext); the effect runner (effects.ts), the
 * subscriber (subscriber.ts), the delivery loops (delivery.ts), flush (flushing.ts), the reads and
 * writes (reads.ts, tracking.ts) and the lifecycle (lifecycle.ts) each take it, instead of reaching
 * into one class's fields. It holds the sans-IO session, the Redis clients, the options, the
 * signals, the outage trackers and the little state the loops hand each other. */

import { randomBytes, randomUUID } from "node:crypto";
import { hostname } from "node:os";
import type { Cluster, Redis } from "ioredis";
import { requirePositive, requireWhole } from "../core/checks.js";
import { Delivery, type DeliverySettings, makeDeliverySettings } from "../core/delivery.js";
import { DeliveryRecovery } from "../core/deliveryRecovery.js";
import { Durability } from "../core/durability.js";
import type { Effect } from "../core/effects.js";
import { UsageError } from "../core/errors.js";
import { DEFAULT_SHARDS, allChannels, allOutboxes, namespaceOfDatabase } from "../core/keys.js";
import { Link, Target } from "../core/link.js";
import { Outage, type Report } from "../core/outage.js";
import { Session, makeSettings } from "../core/session.js";
import { checkedShards } from "../core/shards.js";
import { toUs } from "../core/time.js";
import { describe, isCluster, ownClient, unreachable } from "./connections.js";
import { DurableScripts } from "./durable.js";
import { type Logger, logError, logReport } from "./logger.js";
import type { Clock, DroppedCallback, OutpostOptions } from "./outpost.js";
import { PublicMode, type PublicOptions } from "./publicMode.js";
import { cleartextWarnings, scrubbing, urlSecrets } from "./redact.js";
import { Signal, monotonic, wallUs } from "./signal.js";
import { Telemetry } from "./telemetry.js";
import { Traces } from "./traces.js";

export const DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0";
export const DEFAULT_SERVER_URL = "https://api.polar.sh";
export const POLL = 0.25; // seconds between two looks at the core's deadlines
export const SETTLE = 0.1; // seconds a waiting read sleeps at most between two looks at its copy
export const USER_AGENT = "outpost-node/0.1.0";
export const REMINDER_S = 60.0; // a loop failing again reminds at most this often; one that ran this long starts over
/** Batches whose acknowledged entries settle in one script when they follow each other: fewer,
 * larger scripts (each identity's state is written once a script), at the cost of entries staying
 * counted as undelivered a few batches longer. */
const SETTLE_BATCHES = 4;

const CONSOLE: Logger = {
  debug: () => {},
  warn: (message) => console.warn(message),
  error: (message) => console.error(message),
};

/** One instance's shared parts. */
export class DriverContext {
  readonly redis: Redis | Cluster;
  /** The same client when it is a Redis Cluster's: one slot per command, reads per stream. */
  readonly cluster: Cluster | null;
  readonly ownsRedis: boolean;
  readonly channels: string[];
  /** The deployment's shard count, as configured: agreed with Redis at start. */
  readonly shards: number;
  /** Every shard's outbox stream, in shard order. */
  readonly outboxes: string[];
  readonly accessToken: string | null;
  readonly serverUrl: string;
  readonly core: Session;
  readonly log: Logger;
  readonly deliverySettings: DeliverySettings;
  readonly maxInFlight: number;
  readonly onDropped: DroppedCallback | null;
  /** One machine per delivery loop (a restarted loop gets a fresh one in its place). */
  readonly deliveries: Delivery[] = [];
  /** The delivery loops' own connections (a blocking read needs one). */
  readonly connections: (Redis | Cluster)[] = [];
  readonly telemetry: Telemetry;
  readonly clock: Clock | null;
  readonly traces: Traces;
  /** Fired at each change applied: reads waiting on a copy, the tick loop. */
  readonly signal = new Signal();
  /** Wakes the delivery loops from their waits (a sleep, an idle round, a re-read held off): a
   * flush begins, the instance closes, a loop settled. Not `signal`, which fires at each change
   * applied: every waiting loop went round once per track() of any instance it follows. */
  readonly deliveryWake = new Signal();
  readonly consumer = `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  /** Aborts the ingestion requests in flight when the instance closes. */
  readonly closing = new AbortController();
  /** flush() calls under way: the delivery loops flush while there is one. */
  flushing = 0;
  /** Settle scripts under way (a flush waits for them before it looks). */
  settling = 0;
  closed = false;
  readonly stateOutage = new Outage("loading state");
  readonly subscriberOutage = new Outage("the change subscription");
  /** What the delivery loops do after a Redis failure, and when one re-reads this consumer's
   * pending entries: every loop's Redis failure goes to it (another loop's through redisFailed,
   * a dropped connection's too). */
  readonly recovery = new DeliveryRecovery();
  readonly durability: Durability;
  /** Connections of the scripts that wait for a replica (durability "replica"). */
  readonly durable: DurableScripts;
  /** The mode this instance runs, and the public mode's loop (the client sets it once the effect
   * runner it needs exists). */
  public!: PublicMode;
  /** When a bug was last logged, by where it happened (see bug()). */
  private readonly bugsLogged = new Map<string, number>();

  constructor(options: OutpostOptions, maxInFlight: number, shards: number, redisUrl: string, token: string | null, webhookSecret: string | null, mode: string) {
    this.durability = Durability.of(options.durability ?? "primary", options.durabilityTimeout ?? 1.0);
    // Whatever a line quotes (a client library's message, a URL), no secret reaches the log.
    this.log = scrubbing(options.logger ?? CONSOLE, [token, webhookSecret, ...urlSecrets(redisUrl)]);
    this.ownsRedis = options.redis === undefined;
    this.redis = options.redis ?? ownClient(redisUrl); // it connects at once (ioredis)
    try {
      this.cluster = isCluster(this.redis) ? this.redis : null;
      this.durable = new DurableScripts(this.redis, this.cluster);
      // Pub/sub ignores numbered databases: name the channels after ours (a cluster has one).
      const namespace = namespaceOfDatabase(this.cluster === null ? Number((this.redis as Redis).options.db ?? 0) : 0);
      this.shards = shards;
      this.channels = allChannels(namespace, shards);
      this.outboxes = allOutboxes(shards);
      this.accessToken = token;
      this.serverUrl = options.serverUrl || process.env.POLAR_SERVER_URL || DEFAULT_SERVER_URL;
      this.traces = new Traces(options.recordTo ?? null);
      const link = this.accessToken && mode !== "public" ? new Link(Target.of(this.serverUrl), this.accessToken, this.traces.rng(0), (n) => randomBytes(n)) : null;
      const settings = makeSettings({
        snapshotTimeout: options.snapshotTimeout ?? 5.0,
        channelNamespace: namespace,
        shards,
        ...(options.maxCustomers !== undefined ? { maxCustomers: options.maxCustomers } : {}),
        ...(options.idleCustomerTtl !== undefined ? { idleCustomerTtl: options.idleCustomerTtl } : {}),
      });
      this.core = this.traces.session(new Session(settings, link), settings, link === null ? null : this.serverUrl);
      const claimIdle = options.claimIdle ?? 300;
      const batchSize = options.batchSize ?? 500;
      this.deliverySettings = makeDeliverySettings({
        batchSize,
        linger: options.linger ?? 0.2,
        maxAttempts: options.maxAttempts ?? 10,
        claimIdle,
        claimInterval: Math.min(30, claimIdle / 2),
        backoffBase: options.retryBase ?? 0.5,
        channelNamespace: namespace,
        shards,
        consumer: this.consumer,
        heartbeat: options.heartbeat ?? 10.0,
        requestsPerMinute: options.requestsPerMinute ?? 300.0,
        batchBytes: options.batchBytes ?? 8 * 1024 * 1024,
        settleAlongside: true,
        settleEvery: SETTLE_BATCHES * batchSize,
        readAlongside: true,
      });
      this.maxInFlight = maxInFlight;
      this.onDropped = options.onDropped ?? null;
      this.telemetry = new Telemetry(
        (options.telemetry ?? true) && process.env.POLAR_OUTPOST_TELEMETRY !== "0",
        { url: options.telemetryUrl || this.serverUrl, token: this.accessToken, interval: options.telemetryInterval ?? 30, toApp: options.telemetryToApp ?? false },
        (message) => this.log.warn(message),
        (message) => this.log.debug(message),
      );
      this.clock = options.clock ?? null;
    } catch (exc) {
      // An option refused above: close the client made for it, or it reconnects forever and keeps the process alive.
      if (this.ownsRedis) this.redis.disconnect();
      throw exc;
    }
  }

  /** The event timestamps' clock (the `clock` option, else the wall clock), in µs. */
  nowUs(): number {
    return this.clock === null ? wallUs() : toUs(this.clock.now());
  }

  /** Sleep `seconds`, or less if the instance closes meanwhile. */
  pause(seconds: number): Promise<void> {
    const closing = this.closing.signal;
    return new Promise((resolve) => {
      if (closing.aborted) return resolve();
      const done = () => {
        clearTimeout(timer);
        closing.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, seconds * 1000);
      closing.addEventListener("abort", done, { once: true });
    });
  }

  /** What the core asks for now. What it reported meanwhile is logged first: the core never
   * logs, and every input and question drains here, so no line waits for a later one. */
  drain(): Effect[] {
    for (const report of this.core.reports()) logReport(this.log, report);
    return this.core.effects();
  }

  logReport(report: Report | null): void {
    logReport(this.log, report);
  }

  /** A Redis failure of a loop other than delivery's (the delivery loops ask the recovery): log
   * what its outage says, count it; return the delay. */
  redisFailed(outage: Outage, exc: unknown, client: Redis | Cluster = this.redis): number {
    const [delay, report] = outage.failed(monotonic(), errorText(exc, client), Math.random());
    this.recovery.failedElsewhere();
    this.logReport(report);
    return delay;
  }

  redisAnswered(outage: Outage): void {
    if (outage.down) this.logReport(outage.succeeded(monotonic()));
  }

  /** Why Redis is failing this instance's reads, if it is, to end a NotReady message with. */
  redisCause(): string {
    const error = this.stateOutage.error ?? unreachable(this.redis);
    return error === null ? "" : `; Redis: ${error}`;
  }

  /** A bug of ours where no supervised loop restarts anything: logged with its stack, at most once
   * a minute for each place (`where`: what was being done). */
  bug(where: string, exc: unknown): void {
    const now = monotonic();
    if (now - (this.bugsLogged.get(where) ?? -Infinity) < REMINDER_S) return;
    this.bugsLogged.set(where, now);
    logError(this.log, `outpost: ${where} failed (a bug of ours): ${stackOf(exc)}`);
  }

  /** Snapshots received and applied, for telemetry. */
  syncCounts(): [number, number] {
    const remote = this.core.remote;
    return remote === null ? [0, 0] : [remote.snapshotsReceived, remote.snapshotsApplied];
  }
}

/** Check the options (before any connection is opened: a refusal leaks none) and build the
 * context from them; the public mode's options, for the client to build it with. */
export function openContext(options: OutpostOptions): [DriverContext, PublicOptions] {
  const maxInFlight = options.maxInFlight ?? 1;
  requireWhole("max_in_flight", maxInFlight, 1, "at least 1");
  // 0 would export to Polar's relay on every drain of the effects
  requirePositive("telemetry_interval", options.telemetryInterval ?? 30);
  const shards = checkedShards(options.shards ?? DEFAULT_SHARDS); // before anything is opened
  // An empty setting counts as unset, an argument as a variable (as in Python).
  const redisUrl = options.redisUrl || process.env.REDIS_URL || DEFAULT_REDIS_URL;
  const token = options.accessToken || process.env.POLAR_ACCESS_TOKEN || null;
  const webhookSecret = options.webhookSecret || process.env.POLAR_WEBHOOK_SECRET || null;
  const publicOptions: PublicOptions = {
    mode: options.mode ?? "auto",
    margin: options.publicMargin ?? 60,
    pollInterval: options.pollInterval ?? 300,
    webhookSecret,
    requestsPerMinute: options.requestsPerMinute ?? 300.0,
  };
  PublicMode.check(publicOptions); // before any connection is opened: a refusal leaks none
  const ctx = new DriverContext(options, maxInFlight, shards, redisUrl, token, webhookSecret, publicOptions.mode);
  return [ctx, publicOptions];
}

/** Say what is sent in cleartext (a token to an http:// server, telemetry too). */
export function warnCleartext(ctx: DriverContext, options: OutpostOptions): void {
  const telemetryOn = (options.telemetry ?? true) && process.env.POLAR_OUTPOST_TELEMETRY !== "0";
  for (const warning of cleartextWarnings(ctx.accessToken, ctx.serverUrl, telemetryOn, options.telemetryUrl || ctx.serverUrl)) {
    ctx.log.warn(warning);
  }
}

/** An exception for the log: its stack (which starts with its name and message) when it has one. */
export function stackOf(exc: unknown): string {
  return exc instanceof Error ? (exc.stack ?? exc.message) : String(exc);
}

/** A Redis failure's text for the log (one given as a string stays as it came). */
export function errorText(exc: unknown, client: Redis | Cluster): string {
  return typeof exc === "string" ? exc : describe(exc, client);
}
