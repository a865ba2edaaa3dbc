/** The Outpost client for Node: a thin driver that moves replies and messages between Redis,
 * Polar and the sans-IO core (../core), and runs the effects the core asks for. It mirrors the
 * Python SDK's AsyncOutpost method for method: track(), balance(), flush(), close().
 *
 * JavaScript runs one callback at a time, so the core needs no lock: each call into it runs to
 * its end before any other input is handed to it. */

import { randomBytes, randomUUID } from "node:crypto";
import { hostname } from "node:os";
import { connect as netConnect, type Socket } from "node:net";
import { connect as tlsConnect } from "node:tls";
import type { Cluster, Redis } from "ioredis";
import { Balance } from "../core/balance.js";
import {
  type BatchAnswered,
  type BatchFailed,
  Delivery,
  type DeliverySettings,
  GROUP,
  type DeliveryEffect,
  type DeliveryAnswer,
  makeDeliverySettings,
  nothingDone,
  type OutboxRead,
  type PostAndSettle,
  type ReadOutbox,
  retryAfter,
  type SettleScript,
  withKnownRevs,
} from "../core/delivery.js";
import type { Effect, Fetch, RunScript } from "../core/effects.js";
import { customerOf } from "../core/event.js";
import { type EntryId, FlushWatch, lastEntries } from "../core/flushWatch.js";
import { type AfterFailure, DeliveryRecovery, lostItsData } from "../core/deliveryRecovery.js";
import { type ForgetHeartbeat, handBack } from "../core/liveness.js";
import { Outage, type Report } from "../core/outage.js";
import { Durability, type DurabilityName } from "../core/durability.js";
import { ConfigurationError, InvalidEvent, NotDurable, NotReady, OutpostClosed, RedisUnavailable, UnknownMeter, UnsupportedMeter, UsageError } from "../core/errors.js";
import type { Input } from "../core/inputs.js";
import { CONFIGURATION_KEY, DEFAULT_SHARDS, SHARDS_KEY, allChannels, allOutboxes, namespaceOfDatabase } from "../core/keys.js";
import { checkedShards, firstCount, shardsDisagreement } from "../core/shards.js";
import { Link, Target } from "../core/link.js";
import { SCRIPT_SHA1, SCRIPT_TEXT } from "../core/scripts.generated.js";
import { Session, type TrackArgs, makeSettings } from "../core/session.js";
import { toUs } from "../core/time.js";
import type { RawFields } from "../core/inputs.js";
import { type Logger, logError, logReport } from "./logger.js";
import { ClusterSubscriptions } from "./cluster.js";
import { cleartextWarnings, scrubbing, urlSecrets } from "./redact.js";
import { cannotConnect, describe, isCluster, ownClient, reachable, redisUnavailable, unreachable, watched } from "./connections.js";
import { failedInRedis } from "./redisFailure.js";
import { DurableScripts, WaitFailed } from "./durable.js";
import { Signal, monotonic, wallUs } from "./signal.js";
import { Telemetry, customerAttribute } from "./telemetry.js";
import { trackArgsOf } from "./trackArgs.js";
import { Traces } from "./traces.js";
import { readAtMost } from "./http.js";
import { type Headers, PublicMode } from "./publicMode.js";
import type { Mode } from "../core/publicAnchoring.js";
import { type AdmissionHooks, type Reservation, reserveUnits, trackAdmitted } from "./reservation.js";

export const DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0";
export const DEFAULT_SERVER_URL = "https://api.polar.sh";
const POLL = 0.25; // seconds between two looks at the core's deadlines
const FLUSH_READS = 3; // attempts of a flush's outbox read before it rejects with RedisUnavailable
const SETTLE = 0.1; // seconds a waiting read sleeps at most between two looks at its copy
const USER_AGENT = "outpost-node/0.1.0";
const CLUSTER_POLL = 0.05; // seconds an empty round of reads on a cluster waits before the next, at first
const IDLE_DOUBLINGS = 6; // bounds the doubling (50 ms -> 3.2 s); the read's block (0.5 s) caps it first
const CLOSE_RESERVE = 1.0; // seconds of close()'s timeout kept for what comes after its flush
const LAST_EXPORT = 0.75; // most seconds close() gives the last telemetry export
const RESTART_BASE_S = 0.1; // seconds before a failed loop's first restart, doubled per failure in a row
const RESTART_CAP_S = 5.0;
const REMINDER_S = 60.0; // a loop failing again reminds at most this often; one that ran this long starts over
/** Batches whose acknowledged entries settle in one script when they follow each other: fewer,
 * larger scripts (each identity's state is written once a script), at the cost of entries staying
 * counted as undelivered a few batches longer. */
const SETTLE_BATCHES = 4;

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

/** The most of an ingestion answer read (its error detail): 1 MiB. */
const MAX_ANSWER = 1 << 20;

const CONSOLE: Logger = {
  debug: () => {},
  warn: (message) => console.warn(message),
  error: (message) => console.error(message),
};

interface LinkSocket {
  socket: Socket;
  reported: boolean;
}

export class Outpost {
  private readonly redis: Redis | Cluster;
  /** The same client when it is a Redis Cluster's: one slot per command, reads per stream. */
  private readonly cluster: Cluster | null;
  private clusterSubscriptions: ClusterSubscriptions | null = null;
  private readonly ownsRedis: boolean;
  private readonly channels: string[];
  /** The deployment's shard count, as configured: agreed with Redis at start. */
  private readonly shards: number;
  /** Every shard's outbox stream, in shard order. */
  private readonly outboxes: string[];
  private readonly accessToken: string | null;
  private readonly serverUrl: string;
  private readonly core: Session;
  private readonly log: Logger;
  private readonly deliverySettings: DeliverySettings;
  private readonly maxInFlight: number;
  private readonly onDropped: DroppedCallback | null;
  private readonly deliveries: Delivery[] = [];
  private readonly connections: (Redis | Cluster)[] = [];
  private readonly telemetry: Telemetry;
  private readonly clock: Clock | null;
  private readonly traces: Traces;
  private readonly signal = new Signal();
  /** Wakes the delivery loops from their waits (a sleep, an idle round, a re-read held off): a
   * flush begins, the instance closes, a loop settled. Not `signal`, which fires at each change
   * applied: every waiting loop went round once per track() of any instance it follows. */
  private readonly deliveryWake = new Signal();
  private readonly consumer = `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  private readonly workers: Promise<void>[] = [];
  /** Aborts the ingestion requests in flight when the instance closes. */
  private readonly closing = new AbortController();
  private subscriber: Redis | null = null;
  private link: LinkSocket | null = null;
  private flushing = 0;
  private settling = 0;
  /** On a cluster: rounds of outbox reads in a row that found nothing (see readOutboxesOneByOne). */
  private emptyRounds = 0;
  private starting: Promise<void> | null = null;
  private closed = false;
  private readonly stateOutage = new Outage("loading state");
  private readonly subscriberOutage = new Outage("the change subscription");
  /** The mode this instance runs, and the public mode's loop. */
  private readonly public: PublicMode;
  /** What the delivery loops do after a Redis failure, and when one re-reads this consumer's
   * pending entries: every loop's Redis failure goes to it (another loop's through redisFailed,
   * a dropped connection's too). */
  private readonly recovery = new DeliveryRecovery();
  private readonly durability: Durability;
  /** Connections of the scripts that wait for a replica (durability "replica"). */
  private readonly durable: DurableScripts;
  /** When a bug was last logged, by where it happened (see bug()). */
  private readonly bugsLogged = new Map<string, number>();

  constructor(options: OutpostOptions = {}) {
    const maxInFlight = options.maxInFlight ?? 1;
    if (maxInFlight < 1) throw new UsageError("max_in_flight must be at least 1");
    const shards = checkedShards(options.shards ?? DEFAULT_SHARDS); // before anything is opened
    const redisUrl = options.redisUrl ?? process.env.REDIS_URL ?? DEFAULT_REDIS_URL;
    const token = options.accessToken ?? process.env.POLAR_ACCESS_TOKEN ?? null;
    const webhookSecret = options.webhookSecret ?? process.env.POLAR_WEBHOOK_SECRET ?? null;
    const publicOptions = {
      mode: options.mode ?? "auto",
      margin: options.publicMargin ?? 60,
      pollInterval: options.pollInterval ?? 300,
      webhookSecret,
      requestsPerMinute: options.requestsPerMinute ?? 300.0,
    };
    PublicMode.check(publicOptions); // before any connection is opened: a refusal leaks none
    this.durability = Durability.of(options.durability ?? "primary", options.durabilityTimeout ?? 1.0);
    // Whatever a line quotes (a client library's message, a URL), no secret reaches the log.
    this.log = scrubbing(options.logger ?? CONSOLE, [token, webhookSecret, ...urlSecrets(redisUrl)]);
    this.ownsRedis = options.redis === undefined;
    this.redis = options.redis ?? ownClient(redisUrl);
    this.cluster = isCluster(this.redis) ? this.redis : null;
    this.durable = new DurableScripts(this.redis, this.cluster);
    // Pub/sub ignores numbered databases: name the channels after ours (a cluster has one).
    const namespace = namespaceOfDatabase(this.cluster === null ? Number((this.redis as Redis).options.db ?? 0) : 0);
    this.shards = shards;
    this.channels = allChannels(namespace, shards);
    this.outboxes = allOutboxes(shards);
    this.accessToken = token;
    this.serverUrl = options.serverUrl ?? process.env.POLAR_SERVER_URL ?? DEFAULT_SERVER_URL;
    this.traces = new Traces(options.recordTo ?? null);
    const link = this.accessToken && publicOptions.mode !== "public" ? new Link(Target.of(this.serverUrl), this.accessToken, this.traces.rng(0), (n) => randomBytes(n)) : null;
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
    this.public = new PublicMode(
      {
        core: this.core,
        redis: this.redis,
        signal: this.signal,
        log: this.log,
        serverUrl: this.serverUrl,
        accessToken: this.accessToken,
        userAgent: USER_AGENT,
        closing: this.closing.signal,
        closed: () => this.closed,
        script: (name, keys, args) => this.script(name, keys, args),
        run: (effects) => this.run(effects),
        drain: () => this.drain(),
        pause: (seconds) => this.pause(seconds),
        nowUs: () => this.nowUs(),
      },
      publicOptions,
    );
    this.telemetry = new Telemetry(
      (options.telemetry ?? true) && process.env.POLAR_OUTPOST_TELEMETRY !== "0",
      { url: options.telemetryUrl ?? this.serverUrl, token: this.accessToken, interval: options.telemetryInterval ?? 30, toApp: options.telemetryToApp ?? false },
      (message) => this.log.warn(message),
      (message) => this.log.debug(message),
    );
    this.clock = options.clock ?? null;
    const telemetryOn = (options.telemetry ?? true) && process.env.POLAR_OUTPOST_TELEMETRY !== "0";
    for (const warning of cleartextWarnings(this.accessToken, this.serverUrl, telemetryOn, options.telemetryUrl ?? this.serverUrl)) {
      this.log.warn(warning);
    }
  }

  // -- lifecycle ------------------------------------------------------------------------------

  /** Start the background work (the first call of any method does it too). */
  async start(): Promise<this> {
    await this.ensureStarted();
    return this;
  }

  private ensureStarted(): Promise<void> {
    if (this.closed) return Promise.reject(new OutpostClosed("this Outpost instance is closed"));
    this.starting ??= this.startNow();
    return this.starting;
  }

  private async startNow(): Promise<void> {
    try {
      await this.agreeOnShards(); // nothing is written before the count is agreed
    } catch (exc) {
      this.starting = null; // refused or Redis down: nothing runs, the next call tries again
      throw exc;
    }
    await this.public.beforeStart();
    await this.readCachedConfiguration();
    this.subscribe();
    this.workers.push(this.supervised("tick", () => this.tickLoop()));
    this.workers.push(
      this.public.run().catch((exc: unknown) => {
        logError(this.log, `outpost: the public mode's loop failed: ${String(exc)}`);
      }),
    );
    if (this.accessToken) {
      for (let n = 0; n < this.maxInFlight; n++) {
        this.deliveries.push(this.deliveryMachine(n));
        // A blocking XREADGROUP needs a connection of its own: ioredis pipelines one socket. On a
        // cluster, reads do not block (one per stream): the shared client serves.
        const connection = this.cluster ?? watched((this.redis as Redis).duplicate());
        if (connection !== this.redis) this.connections.push(connection);
        this.workers.push(
          this.supervised(`delivery ${n}`, (restarted) => {
            if (restarted) {
              // A fresh machine; what the failed one held is still pending for this consumer,
              // and is read again.
              this.deliveries[n] = this.deliveryMachine(n);
              this.recovery.restarted(n);
            }
            return this.deliveryLoop(this.deliveries[n] as Delivery, connection, n);
          }),
        );
      }
    } else {
      this.log.warn("outpost has no access token: events stay queued in Redis until an instance with a token delivers them");
    }
  }

  /** Deliver every event queued when the call started, by any instance. Resolves true once each
   * was delivered or dropped (and reported), false if some were still queued after `timeout`
   * seconds (they stay queued, nothing is lost). Rejects with RedisUnavailable when Redis
   * cannot be read. */
  async flush(timeout = 10.0): Promise<boolean> {
    await this.ensureStarted();
    const watch = new FlushWatch(await this.outboxMarks(), monotonic(), timeout);
    this.flushing += 1;
    this.deliveryWake.fire();
    try {
      for (;;) {
        const version = this.deliveryWake.version;
        const state = { settling: this.settling > 0, holdingNothing: this.holdingNothing };
        if (watch.lookNow(monotonic(), state) && watch.looked(await this.outboxLeft(watch.marks))) return true;
        const wait = watch.wait(monotonic());
        if (wait === null) return false;
        await this.deliveryWake.wait(version, wait); // a settle of this instance wakes it
      }
    } finally {
      this.flushing -= 1;
    }
  }

  /** Whether every delivery loop of this instance holds nothing read and not yet settled. */
  private get holdingNothing(): boolean {
    return this.deliveries.every((d) => d.idle);
  }

  /** Flush, stop the background work and release connections, within `timeout` seconds
   * whatever is down (what is not delivered stays queued in Redis for the next instance). Safe
   * to call twice. */
  async close(timeout = 10.0): Promise<void> {
    if (this.closed) return;
    const deadline = monotonic() + timeout;
    const left = () => Math.max(0, deadline - monotonic());
    this.telemetry.quiet(); // an exporter failing from here on is one DEBUG line at the end
    const blocked = this.deliveries.find((d) => d.blocked)?.stalled ?? null;
    if (blocked !== null) {
      // Polar refuses what only an operator fixes: a flush could only wait it out.
      this.log.warn(`outpost closes without flushing (delivery is stalled: ${blocked}); the queued events stay in Redis for the next instance`);
    } else if (this.starting !== null && this.deliveries.length) {
      // What comes after the flush (workers, hand-back, the last export) keeps a reserve.
      const flushing = this.flush(timeout - Math.min(CLOSE_RESERVE, timeout / 2)).catch(() => false);
      await within(flushing, left() - Math.min(CLOSE_RESERVE, timeout / 2)); // Redis down: events stay queued
    }
    this.feed({ kind: "Closing" }); // a close frame to Polar while the socket is still open
    this.closed = true;
    this.closing.abort();
    this.signal.fire();
    this.deliveryWake.fire();
    const link = this.link;
    this.link = null;
    if (link !== null) {
      link.reported = true;
      link.socket.end(); // after the close frame Closing queued; destroyed if Polar lingers
      setTimeout(() => link.socket.destroy(), 1000).unref();
    }
    this.subscriber?.disconnect();
    this.clusterSubscriptions?.stop();
    // A loop waiting on Redis (a blocking read, a connection attempt) ends when its connection
    // is dropped below; the reserve keeps time for the hand-back and the last export.
    await within(Promise.allSettled(this.workers), left() - Math.min(LAST_EXPORT, left() / 2));
    if (this.deliveries.length) await within(this.handBack(this.redis), left() - Math.min(LAST_EXPORT, left() / 2));
    for (const connection of this.connections) connection.disconnect();
    this.durable.close();
    await this.telemetry.shutdown(monotonic(), ...this.syncCounts(), Math.min(LAST_EXPORT, left()));
    if (this.ownsRedis) this.redis.disconnect();
    await this.traces.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** Why delivery to Polar is stalled (a rejected token, a wrong URL), or null. */
  get deliveryStalled(): string | null {
    return this.deliveries.find((d) => d.stalled)?.stalled ?? null;
  }

  /** How Polar is followed: "snapshots" (the snapshot protocol), "public" (Polar's public API:
   * polls and webhooks), or "auto" while the instance has not found out yet. */
  get mode(): Mode {
    return this.public.mode;
  }

  /** Why this mode runs (asked for, or what Polar answered on /v1/outpost/). */
  get modeReason(): string {
    return this.public.reason;
  }

  /** The public mode: verify a webhook delivery from Polar (its raw body, unparsed, and its
   * headers), take it once for every instance sharing the Redis, and apply the customer meters
   * it carries; resolve to the HTTP status to answer Polar with. Rejects with InvalidWebhook
   * when the signature does not hold (answer 401), UsageError without the endpoint's secret,
   * RedisUnavailable. */
  async handleWebhook(body: Uint8Array, headers: Headers): Promise<number> {
    await this.ensureStarted();
    return this.public.handleWebhook(body, headers);
  }

  /** Whether the WebSocket to Polar is open. */
  get connected(): boolean {
    return this.core.connected;
  }

  /** Whether the copies are following Redis's change channels right now. */
  get subscribed(): boolean {
    return this.core.subscribed;
  }

  /** How many inputs from peers were rejected, by kind (each was logged). */
  get rejections(): Record<string, number> {
    const counts = Object.fromEntries(this.core.rejections);
    const outbox = this.deliveries.reduce((n, d) => n + d.rejectedEntries, 0);
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
    const started = performance.now();
    const customer = this.telemetry.enabled ? customerAttribute(options.externalCustomerId, options.customerId) : "";
    try {
      const [eventId, run] = await this.trackNow(name, options);
      this.telemetry.tracked(customer, run.meterIds, (performance.now() - started) / 1000, "ok", run.buckets);
      return eventId;
    } catch (exc) {
      const outcome = exc instanceof InvalidEvent ? "invalid" : exc instanceof NotReady ? "not_ready" : exc instanceof RedisUnavailable ? "redis_error" : null;
      if (outcome !== null) this.telemetry.tracked(customer, [], (performance.now() - started) / 1000, outcome, 0);
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
    return {
      core: this.core,
      oneSlot: this.cluster !== null,
      telemetry: this.telemetry,
      ensureStarted: () => this.ensureStarted(),
      trackScript: (args) => this.trackScript(args),
      writeScript: (run, replied) => this.writeScript(run, replied),
      run: (effects) => this.run(effects),
      drain: () => this.drain(),
      nowUs: () => this.nowUs(),
      balance: (meterId, customer) => this.balance(meterId, customer),
    };
  }

  private async trackNow(name: string, options: TrackOptions): Promise<[string, RunScript]> {
    const args = trackArgsOf(name, options, this.nowUs());
    const eventId = args.eventId;
    const run = await this.trackScript(args);
    const shortfall = await this.writeScript(run, (reply, ticket) => {
      this.core.handle({ kind: "ScriptReplied", reply, tag: null, ticket });
    });
    const effects = this.drain();
    if (effects.length) await this.run(effects);
    if (shortfall !== null) throw new NotDurable(`event ${eventId} is on the primary only: ${shortfall}`, eventId);
    return [eventId, run];
  }

  /** Run a script that writes a customer's state (track, admission), waiting for a replica when
   * durability asks. The core gives it a ticket (its echo may come before its reply: the core
   * holds what comes meanwhile); `replied` gets its reply and that ticket as soon as the reply
   * comes (before WAIT's answer), for the core. A script that never replied ends its ticket as
   * failed (the core applies what it held for it). Resolves to why the write is less durable than
   * asked (null: it is not); a failure of the script rejects with RedisUnavailable. */
  private async writeScript(run: RunScript, replied: (reply: unknown, ticket: number) => void): Promise<string | null> {
    const ticket = this.core.scriptSent();
    let ended = false;
    const end = (reply: unknown): void => {
      ended = true;
      replied(reply, ticket);
    };
    try {
      const wait = this.durability.wait();
      if (wait === null) {
        end(await this.script(run.script, run.keys, run.args));
        return null;
      }
      let answer: unknown;
      try {
        reachable(this.redis);
        answer = await this.durable.run(run.script, run.keys, run.args, wait, end);
      } catch (exc) {
        throw redisUnavailable(`running ${run.script}`, exc, this.redis);
      }
      // The script replied and its connection broke before WAIT answered: written, maybe not copied.
      return answer instanceof WaitFailed ? `WAIT failed: ${answer.reason}` : this.durability.shortfall(answer);
    } finally {
      if (!ended) this.core.handle({ kind: "ScriptFailed", tag: null, ticket });
    }
  }

  /** Run script `name`; Redis failing rejects with RedisUnavailable (`raw`: with the client's own
   * error), a bug of ours with itself. */
  private async script(name: string, keys: string[], args: string[], client: Redis | Cluster = this.redis, raw = false): Promise<unknown> {
    if (raw) return this.evalScript(name, keys, args, client);
    try {
      return await this.evalScript(name, keys, args, client);
    } catch (exc) {
      throw redisUnavailable(`running ${name}`, exc, client);
    }
  }

  private async evalScript(name: string, keys: string[], args: string[], client: Redis | Cluster): Promise<unknown> {
    reachable(client);
    try {
      return await client.evalsha(SCRIPT_SHA1[name] as string, keys.length, ...keys, ...args);
    } catch (exc) {
      if (!String(exc).includes("NOSCRIPT")) throw exc;
      return await client.eval(SCRIPT_TEXT[name] as string, keys.length, ...keys, ...args);
    }
  }

  /** The core's track script for `args`; before Polar's configuration came, it waits for it
   * first (up to snapshotTimeout). */
  private async trackScript(args: TrackArgs): Promise<RunScript> {
    try {
      return this.core.track(args);
    } catch (exc) {
      if (!(exc instanceof NotReady)) throw exc;
      await this.waitForConfiguration();
      return this.core.track(args);
    }
  }

  private async waitForConfiguration(): Promise<void> {
    const deadline = monotonic() + this.core.settings.snapshotTimeout;
    while (this.core.configuration === null) {
      const remaining = deadline - monotonic();
      if (remaining <= 0) {
        const [state, error] = this.core.linkStatus();
        let reason = `no configuration from Polar yet (WebSocket ${state}${error ? `: ${error}` : ""})`;
        if (this.public.mode !== "snapshots") reason = this.public.notReadyReason(reason, "");
        throw new NotReady(`${reason}: cannot tell which meters count the event${this.redisCause()}`);
      }
      const version = this.signal.version;
      await this.readCachedConfiguration();
      await this.signal.wait(version, Math.min(remaining, SETTLE));
    }
  }

  // -- balance --------------------------------------------------------------------------------

  /** The customer's balance of a meter, from memory once warm. The first read of a customer
   * waits for its state (and Polar's snapshot) up to snapshotTimeout; later reads cost no
   * network call. Rejects with NotReady, UnknownMeter or UnsupportedMeter. */
  balance(meterId: string, customer: CustomerOptions = {}): Promise<Balance> {
    // The warm path is not an async function: no frame of its own, one resolved promise.
    if (this.closed) return Promise.reject(new OutpostClosed("this Outpost instance is closed"));
    const external = customer.externalCustomerId ?? null;
    const internal = customer.customerId ?? null;
    const fresh = customer.fresh ?? false;
    const telemetry = this.telemetry.enabled;
    const started = telemetry ? performance.now() : 0;
    if (!fresh) {
      const cached = this.core.cachedBalance(meterId, external, internal);
      if (cached !== null) {
        if (telemetry) this.telemetry.readWarm(meterId, customerAttribute(external, internal));
        return Promise.resolve(cached);
      }
    }
    return this.coldBalance(meterId, external, internal, fresh, started);
  }

  private async coldBalance(meterId: string, external: string | null, internal: string | null, fresh: boolean, started: number): Promise<Balance> {
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
      if (this.telemetry.enabled) this.telemetry.readDone(meterId, customerAttribute(external, internal), (performance.now() - started) / 1000, outcome);
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
          const timeout = this.core.settings.snapshotTimeout;
          throw new NotReady(`the local state could not be loaded from Redis after ${timeout} s (Redis unreachable: ${exc.message})`);
        }
        await new Promise((resolve) => setTimeout(resolve, Math.min(remaining, SETTLE) * 1000));
      }
    }
  }

  private async balanceWhenReady(meterId: string, external: string | null, internal: string | null, fresh: boolean): Promise<Balance> {
    const deadline = monotonic() + this.core.settings.snapshotTimeout;
    await this.startedBy(deadline);
    for (;;) {
      const version = this.signal.version;
      const remaining = deadline - monotonic();
      // At the deadline, a copy still waiting for the subscription reads Redis.
      const found = this.core.read(meterId, external, internal, fresh || remaining <= 0);
      const effects = this.drain();
      // Run them whatever the read found: dropping them would leave their flow waiting.
      if (effects.length) await this.run(effects);
      if (found !== null && !(found instanceof Balance)) {
        const fetched = await this.fetch(found, meterId, external, internal);
        if (fetched !== null) return fetched;
      } else if (found !== null) {
        return found;
      } else if (effects.length) {
        continue;
      }
      this.public.wanted(external, internal);
      if (remaining <= 0) {
        let reason = this.core.notReadyReason(meterId, external, internal);
        if (this.public.mode !== "snapshots") reason = this.public.notReadyReason(reason, String(customerOf(external, internal)));
        throw new NotReady(`${reason} after ${this.core.settings.snapshotTimeout} s${this.redisCause()}`);
      }
      if (this.core.configuration === null) await this.readCachedConfiguration();
      await this.signal.wait(version, Math.min(remaining, SETTLE));
    }
  }

  /** A read that must not come from memory: one HGETALL per key of the customer and its
   * aliases, in one round trip, computed by the core. */
  private async fetch(fetch: Fetch, meterId: string, external: string | null, internal: string | null): Promise<Balance | null> {
    let fields: Map<string, RawFields>;
    try {
      fields = await this.hgetallEach(fetch.keys);
    } catch (exc) {
      throw redisUnavailable(`reading ${fetch.keys.join(", ")}`, exc, this.redis);
    }
    const found = this.core.readFetched(meterId, external, internal, fields);
    const effects = this.drain();
    if (effects.length) await this.run(effects);
    return found;
  }

  private async hgetallEach(keys: string[]): Promise<Map<string, RawFields>> {
    reachable(this.redis);
    if (this.cluster !== null) {
      // The keys' slots differ: one command each, all sent at once.
      const replies = await Promise.all(keys.map((key) => this.redis.hgetall(key)));
      return new Map(keys.map((key, i) => [key, replies[i] as RawFields]));
    }
    if (keys.length === 1) return new Map([[keys[0] as string, await this.redis.hgetall(keys[0] as string)]]);
    const pipeline = this.redis.pipeline();
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

  // -- driving the core -----------------------------------------------------------------------

  /** Run effects, and those their outcomes cause, until the core asks for nothing more. */
  private async run(effects: Effect[]): Promise<void> {
    while (effects.length) {
      for (const effect of effects) {
        switch (effect.kind) {
          case "LoadIdentity":
            await this.load(effect.key, effect.loadId);
            break;
          case "StoreConfiguration":
            try {
              reachable(this.redis);
              await this.redis.set(effect.key, effect.text);
            } catch (exc) {
              if (!failedInRedis(exc)) throw exc;
              this.log.debug(`outpost could not cache the configuration: ${describe(exc, this.redis)}`);
            }
            break;
          case "RunScript": {
            let reply: unknown;
            try {
              reply = await this.script(effect.script, effect.keys, effect.args);
            } catch (exc) {
              if (!(exc instanceof RedisUnavailable)) throw exc; // a bug of ours (script() says which)
              this.redisFailed(this.stateOutage, exc);
              if (effect.tag !== null) this.core.handle({ kind: "ScriptFailed", tag: effect.tag });
              continue;
            }
            this.redisAnswered(this.stateOutage);
            this.core.handle({ kind: "ScriptReplied", reply, tag: effect.tag }); // its echo is dropped when it comes
            break;
          }
          case "SendBytes":
            this.send(effect.data);
            break;
          case "ListPending":
            await this.listPending(effect.tag, effect.keys);
            break;
          case "OpenConnection":
            this.open(effect.host, effect.port, effect.tls, effect.timeout);
            break;
          case "CloseConnection":
            this.dropSocket();
            break;
          default: {
            const unhandled: never = effect; // an effect of the core without a case fails to compile
            throw new Error(`no case for ${JSON.stringify(unhandled)}`);
          }
        }
      }
      effects = this.drain();
    }
    const seen = this.core.observations();
    if (seen.length) this.telemetry.observe(seen);
    this.signal.fire();
  }

  /** Why Redis is failing this instance's reads, if it is, to end a NotReady message with. */
  private redisCause(): string {
    const error = this.stateOutage.error ?? unreachable(this.redis);
    return error === null ? "" : `; Redis: ${error}`;
  }

  /** A Redis failure of a loop other than delivery's (the delivery loops ask the recovery): log
   * what its outage says, count it; return the delay. */
  private redisFailed(outage: Outage, exc: unknown, client: Redis | Cluster = this.redis): number {
    const [delay, report] = outage.failed(monotonic(), errorText(exc, client), Math.random());
    this.recovery.failedElsewhere();
    this.logReport(report);
    return delay;
  }

  private redisAnswered(outage: Outage): void {
    if (outage.down) this.logReport(outage.succeeded(monotonic()));
  }

  private logReport(report: Report | null): void {
    logReport(this.log, report);
  }

  /** A bug of ours where no supervised loop restarts anything: logged with its stack, at most once
   * a minute for each place (`where`: what was being done). */
  private bug(where: string, exc: unknown): void {
    const now = monotonic();
    if (now - (this.bugsLogged.get(where) ?? -Infinity) < REMINDER_S) return;
    this.bugsLogged.set(where, now);
    logError(this.log, `outpost: ${where} failed (a bug of ours): ${stackOf(exc)}`);
  }

  /** What the core asks for now. What it reported meanwhile is logged first: the core never
   * logs, and every input and question drains here, so no line waits for a later one. */
  private drain(): Effect[] {
    for (const report of this.core.reports()) logReport(this.log, report);
    return this.core.effects();
  }

  /** Hand one input to the core and run what it asks for (in the background). */
  private feed(input: Input): void {
    const linkInput = input.kind === "BytesReceived" || input.kind === "ConnectionOpened" || input.kind === "ConnectionFailed";
    if (linkInput && this.core.remote === null) return; // a socket's last words after the public mode dropped the link
    this.core.handle(input);
    if (linkInput && this.public.decide()) this.dropSocket(); // Polar serves only its public API
    const effects = this.drain();
    if (effects.length || input.kind !== "Tick") {
      this.run(effects).catch((exc: unknown) => this.bug("running the core's effects", exc));
    }
  }

  private tick(): void {
    this.feed({ kind: "Tick", now: monotonic(), wallUs: this.nowUs() });
  }

  private untilDeadline(): number {
    const deadline = this.core.nextDeadline();
    if (deadline === null) return POLL;
    return Math.min(Math.max(deadline - monotonic(), 0), POLL);
  }

  /** Time passes for the core: ticks at its deadlines, and at least every POLL seconds. */
  private deliveryMachine(n: number): Delivery {
    const started = monotonic();
    return this.traces.delivery(n, new Delivery(this.deliverySettings, this.traces.rng(n + 1), started), this.deliverySettings, started);
  }

  /** Run a background loop until the instance closes. One that fails (a bug of ours: Redis
   * failures are retried inside each loop) is logged with its stack, then reminded of at most
   * once a minute while it keeps failing, and started again after a backoff (0.1 s, doubled per
   * failure in a row, up to 5 s): no loop dies for good, and none silently. */
  private async supervised(name: string, loop: (restarted: boolean) => Promise<void>): Promise<void> {
    let [failures, startedAt, remindedAt] = [0, monotonic(), -Infinity];
    while (!this.closed) {
      try {
        await loop(failures > 0);
        return;
      } catch (exc) {
        if (this.closed) return;
        const now = monotonic();
        failures = now - startedAt >= REMINDER_S ? 1 : failures + 1; // a long run starts over
        if (failures === 1 || now - remindedAt >= REMINDER_S) {
          remindedAt = now;
          logError(this.log, `outpost: the ${name} loop failed (${failures} in a row; restarted): ${stackOf(exc)}`);
        }
        await this.pause(Math.min(RESTART_CAP_S, RESTART_BASE_S * 2 ** (failures - 1)));
        startedAt = monotonic();
      }
    }
  }

  private async tickLoop(): Promise<void> {
    while (!this.closed) {
      const version = this.signal.version;
      this.tick();
      if (this.telemetry.enabled) {
        const organization = this.core.configuration?.organizationId;
        if (organization !== undefined) this.telemetry.exportToRelay(organization);
        void this.telemetry.flush(monotonic(), ...this.syncCounts()); // records in slices; ticks go on
      }
      await this.signal.wait(version, this.untilDeadline());
    }
  }

  private async load(key: string, loadId: number): Promise<void> {
    let fields: Record<string, string>;
    try {
      reachable(this.redis);
      fields = await this.redis.hgetall(key);
    } catch (exc) {
      if (!failedInRedis(exc)) throw exc;
      this.redisFailed(this.stateOutage, exc);
      this.core.handle({ kind: "LoadFailed", key, loadId });
      return;
    }
    this.redisAnswered(this.stateOutage);
    this.core.handle({ kind: "IdentityLoaded", key, fields, loadId });
  }

  /** HKEYS of each key the core names (state hashes, then the cold buckets' events hashes), in
   * one round trip. */
  private async listPending(tag: number, keys: string[]): Promise<void> {
    const fields = new Map<string, unknown[]>();
    try {
      reachable(this.redis);
      if (this.cluster !== null) {
        const replies = await Promise.all(keys.map((key) => this.redis.hkeys(key)));
        keys.forEach((key, i) => fields.set(key, replies[i] as unknown[]));
        this.redisAnswered(this.stateOutage);
        this.core.handle({ kind: "PendingListed", tag, fields });
        return;
      }
      const pipeline = this.redis.pipeline();
      for (const key of keys) pipeline.hkeys(key);
      const replies = (await pipeline.exec()) ?? [];
      keys.forEach((key, i) => {
        const [error, names] = replies[i] ?? [new Error("no reply"), null];
        if (error) throw error;
        fields.set(key, names as unknown[]);
      });
    } catch (exc) {
      if (!failedInRedis(exc)) throw exc;
      this.redisFailed(this.stateOutage, exc);
      this.core.handle({ kind: "ListFailed", tag });
      return;
    }
    this.redisAnswered(this.stateOutage);
    this.core.handle({ kind: "PendingListed", tag, fields });
  }

  /** The deployment's shard count, agreed with Redis once, at start: stored where Redis holds
   * none (16 where outbox streams of instances that could not choose one are there), refused
   * with ConfigurationError where Redis holds another. */
  private async agreeOnShards(): Promise<void> {
    let stored: string | null;
    try {
      reachable(this.redis);
      stored = await this.redis.get(SHARDS_KEY);
      if (stored === null) {
        let legacy = 0;
        for (const stream of allOutboxes(DEFAULT_SHARDS)) legacy += await this.redis.exists(stream); // one slot each
        await this.redis.set(SHARDS_KEY, String(firstCount(this.shards, legacy > 0)), "NX"); // a race: one wins
        stored = await this.redis.get(SHARDS_KEY);
      }
    } catch (exc) {
      const unavailable = redisUnavailable("reading the deployment's shard count", exc, this.redis); // (a bug: thrown as it is)
      this.redisFailed(this.stateOutage, exc); // said once, then once a minute, while it lasts
      throw unavailable;
    }
    this.redisAnswered(this.stateOutage);
    const why = shardsDisagreement(this.shards, stored);
    if (why !== null) throw new ConfigurationError(why);
  }

  private async readCachedConfiguration(): Promise<void> {
    let text: string | null;
    try {
      reachable(this.redis);
      text = await this.redis.get(CONFIGURATION_KEY);
    } catch (exc) {
      if (!failedInRedis(exc)) throw exc;
      this.redisFailed(this.stateOutage, exc);
      return;
    }
    if (text === null) return;
    let payload: unknown = text;
    try {
      payload = JSON.parse(text);
    } catch {
      payload = text;
    }
    this.core.handle({ kind: "ConfigurationReceived", payload, fromCache: true });
    await this.run(this.drain());
  }

  // -- Redis's change channels ----------------------------------------------------------------

  /** Follow every shard's change channel; after any (re)subscription, reload the copies. */
  private subscribe(): void {
    if (this.cluster !== null) return this.subscribeToCluster(this.cluster);
    const subscriber = watched((this.redis as Redis).duplicate({ autoResubscribe: false, maxRetriesPerRequest: null }));
    this.subscriber = subscriber;
    // Each failed attempt counts; the outage says so once, then once a minute.
    subscriber.on("error", (exc: unknown) => {
      if (!this.closed) this.redisFailed(this.subscriberOutage, exc, subscriber);
    });
    subscriber.on("close", () => {
      if (!this.closed) this.recovery.failedElsewhere(); // a dropped connection: delivery re-reads its pending entries
      // Until Redis confirms the subscription again, no copy follows it: reads go to Redis.
      if (this.core.subscribed) this.feed({ kind: "SubscriberLost" });
    });
    subscriber.on("smessage", (_channel: string, message: string) => this.heard(message));
    subscriber.on("ready", () => {
      subscriber.ssubscribe(...this.channels).then(
        (count) => {
          if (this.closed) return;
          // ioredis resolves once Redis confirmed every channel: the last confirmation's count.
          this.feed({ kind: "SubscriptionConfirmed", count: Number(count) });
          if (this.core.subscribed) this.redisAnswered(this.subscriberOutage);
        },
        (exc: unknown) => {
          if (!this.closed) this.redisFailed(this.subscriberOutage, exc, subscriber);
        },
      );
    });
  }

  /** A change published on a channel this instance follows. */
  private heard(message: string): void {
    if (this.core.ownEcho(message)) return; // this instance's own change, already applied
    const held = this.core.holding; // scripts of this instance in flight: it may be one's echo, come early
    this.core.handle({ kind: "ChangePublished", data: message });
    if (held) return; // applied with a reply (or a failure) of those scripts, and its effects run then
    this.core.handle({ kind: "Tick", now: monotonic(), wallUs: this.nowUs() });
    this.run(this.drain()).catch((exc: unknown) => this.bug("running the core's effects", exc));
  }

  /** One sharded subscription per node, for the channels whose slots it owns now; a break or a
   * move loses only that node's channels (their shards' copies read Redis until confirmed again
   * on the new owner), the other shards' copies keep following. */
  private subscribeToCluster(cluster: Cluster): void {
    const subscriptions = new ClusterSubscriptions(cluster, this.channels, {
      confirmed: (channel) => {
        if (this.closed) return;
        this.feed({ kind: "ChannelSubscribed", channel });
        if (this.core.subscribed) this.redisAnswered(this.subscriberOutage);
      },
      lost: (channels) => {
        if (!this.closed) this.feed({ kind: "ChannelsLost", channels });
      },
      message: (data) => this.heard(data),
      failed: (exc) => {
        if (this.closed) return 1;
        if (failedInRedis(exc)) return this.redisFailed(this.subscriberOutage, exc);
        this.bug("following the Redis Cluster's slot map", exc); // not an outage: looked at again later
        return RESTART_CAP_S;
      },
    });
    this.clusterSubscriptions = subscriptions;
    subscriptions.start();
  }

  // -- the WebSocket's socket -----------------------------------------------------------------

  private open(host: string, port: number, tls: boolean, timeout: number): void {
    if (this.closed) return;
    const socket = tls ? tlsConnect({ host, port, servername: host }) : netConnect({ host, port });
    const link: LinkSocket = { socket, reported: false };
    let opened = false;
    const fail = (reason: string) => {
      if (link.reported) return;
      link.reported = true;
      if (this.link === link) this.link = null;
      socket.destroy();
      this.feed({ kind: "ConnectionFailed", now: monotonic(), reason });
    };
    const timer = setTimeout(() => fail(`cannot connect to ${host}:${port}: timed out`), timeout * 1000);
    socket.setNoDelay(true);
    socket.once(tls ? "secureConnect" : "connect", () => {
      clearTimeout(timer);
      if (link.reported || this.closed) return socket.destroy();
      opened = true;
      this.link = link;
      this.feed({ kind: "ConnectionOpened", now: monotonic() });
    });
    socket.on("data", (data: Buffer) => {
      if (link.reported) return;
      this.feed({ kind: "BytesReceived", now: monotonic(), data: new Uint8Array(data) });
    });
    socket.on("end", () => {
      if (link.reported) return;
      link.reported = true; // the core learns of the end from the empty read
      if (this.link === link) this.link = null;
      this.feed({ kind: "BytesReceived", now: monotonic(), data: new Uint8Array(0) });
      socket.destroy();
    });
    socket.on("error", (exc: Error) => {
      clearTimeout(timer);
      fail(opened ? `connection lost: ${exc.message}` : cannotConnect(exc, host, port));
    });
    socket.on("close", () => {
      clearTimeout(timer);
      fail("connection lost: closed");
    });
  }

  private send(data: Uint8Array): void {
    const link = this.link;
    if (link === null || link.socket.destroyed) return; // asked again on reconnect
    link.socket.write(data);
  }

  /** The core dropped the connection: close the socket without telling it again. */
  private dropSocket(): void {
    const link = this.link;
    this.link = null;
    if (link === null) return;
    link.reported = true;
    link.socket.end();
    setTimeout(() => link.socket.destroy(), 1000).unref();
  }

  // -- delivery -------------------------------------------------------------------------------

  private async deliveryLoop(delivery: Delivery, connection: Redis | Cluster, number: number): Promise<void> {
    await this.retrying(number, () => this.createGroups(connection), undefined, connection); // Redis may be down at start
    while (!this.closed) {
      const flushing = this.flushing > 0;
      if (flushing !== delivery.flushing) delivery.handle({ kind: "Flushing", on: flushing });
      delivery.handle({ kind: "Tick", now: monotonic(), wallUs: this.nowUs() });
      const [action] = delivery.effects() as [DeliveryEffect]; // one effect a drain
      const moves = MOVES_ENTRIES.has(action.kind);
      if (moves) this.recovery.readStarted(); // a re-read of this consumer's entries waits meanwhile
      let outcome: DeliveryAnswer;
      try {
        outcome = await this.act(action, connection, number);
      } finally {
        if (moves) this.recovery.readEnded();
      }
      delivery.handle({ kind: "Tick", now: monotonic(), wallUs: this.nowUs() });
      delivery.handle(outcome);
      for (const report of delivery.reports()) this.logReport(report);
      if (outcome.kind === "Settled" || action.kind === "PostAndSettle") {
        this.signal.fire(); // the ticks, and reads waiting on this instance's copies
        this.deliveryWake.fire(); // a flush waiting; a loop holding off its re-read until none holds
      }
    }
  }

  /** Do one delivery action. Redis failures are retried until they succeed (or the instance
   * closes): settling must not be skipped, and a read can simply wait. */
  private act(action: DeliveryEffect, connection: Redis | Cluster, number: number): Promise<DeliveryAnswer> {
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
    const meanwhile = async (): Promise<OutboxRead | null> => {
      // The read first: the loop needs it as soon as the post returns.
      const found = ask === null ? null : await this.readAlongside(ask, connection, number);
      await this.settleAll(action.settles, connection, number);
      return found;
    };
    // Both end before a failure of one ends the loop: nothing of a failed loop is left in flight
    // when its restart re-reads this consumer's pending entries.
    const work = [this.post(action.post.body), meanwhile()] as const;
    await allEnded(work);
    const [answer, found] = await Promise.all(work);
    return found === null ? answer : { kind: "PostedAlongside", answer, read: found };
  }

  /** A read beside a post, tried once: on a Redis failure it found nothing, and what it may have
   * taken is read again from this consumer's pending entries later. */
  private async readAlongside(action: ReadOutbox, connection: Redis | Cluster, number: number): Promise<OutboxRead> {
    try {
      return await this.readOutbox(action, connection);
    } catch (exc) {
      if (!failedInRedis(exc)) throw exc;
      this.logReport(this.recovery.readBesidePostFailed(number, monotonic(), errorText(exc, connection), Math.random(), { closing: this.closed }));
      return { kind: "OutboxRead", entries: [] };
    }
  }

  /** Every script of `settles`, at once (their commands go out together), each retried until Redis
   * answers; a bug in one throws once the others ended. */
  private async settleAll(settles: SettleScript[], connection: Redis | Cluster, number: number): Promise<void> {
    await allEnded(settles.map((settle) => this.retrying(number, () => this.actOnce(settle, connection, number), SETTLED, connection)));
  }

  /** call() until Redis answers, doing what the instance's recovery says after each failure of
   * delivery loop `loop` in Redis; `closing` (nothing done, the work stays queued in Redis) once it
   * gives up. Anything else call() throws is a bug of ours, thrown on (the loop's supervisor logs
   * it and restarts the loop, which reads this consumer's pending entries again). */
  private async retrying<T>(loop: number, call: () => Promise<T>, closing: T, client: Redis | Cluster): Promise<T> {
    for (;;) {
      let result: T;
      try {
        result = await call();
      } catch (exc) {
        if (!failedInRedis(exc)) throw exc; // a bug of ours: the loop's supervisor logs it and restarts the loop
        const options = { lostData: lostItsData(String(exc)), closing: this.closed };
        const after = this.recovery.failed(loop, monotonic(), errorText(exc, client), Math.random(), options);
        if (after.kind === "GiveUp") return closing;
        await this.afterFailure(after);
        continue;
      }
      this.logReport(this.recovery.answered(loop, monotonic()));
      return result;
    }
  }

  private async afterFailure(after: Exclude<AfterFailure, { kind: "GiveUp" }>): Promise<void> {
    if (after.kind === "RecreateGroups") {
      await this.createGroups(this.redis).catch((exc: unknown) => {
        if (!failedInRedis(exc)) throw exc; // (Redis failing: the next try meets it again)
      });
    } else {
      this.logReport(after.report);
    }
    await this.pause(after.seconds);
  }

  /** Sleep `seconds`, or less if the instance closes meanwhile. */
  private pause(seconds: number): Promise<void> {
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

  /** Once the loops stopped: this instance's heartbeat goes, so other instances take what it
   * still holds at their next survey, and it leaves the group where it holds nothing. */
  private async handBack(connection: Redis | Cluster): Promise<void> {
    try {
      for (const action of handBack(this.consumer, this.shards)) await this.actOnce(action, connection);
    } catch (exc) {
      if (!failedInRedis(exc)) return this.bug("handing back the outbox entries", exc);
      this.log.warn(`outpost could not hand back its outbox entries (others take them once its heartbeat expires): ${describe(exc, connection)}`);
    }
  }

  private async actOnce(action: DeliveryEffect | ForgetHeartbeat, connection: Redis | Cluster, number = -1): Promise<DeliveryAnswer> {
    switch (action.kind) {
      case "ReadOutbox":
        return this.readOutbox(action, connection);
      case "PostBatch":
        return this.post(action.body);
      case "PostAndSettle": // (a loop runs these through act())
        return this.postAndSettle(action, connection, Math.max(number, 0));
      case "SettleScripts":
        return this.settleAll(action.settles, connection, Math.max(number, 0)).then(() => SETTLED);
      case "SettleScript": {
        // Told which revisions this instance holds, the script replies with what changed, so
        // this instance's copies (and a flush() waiting on them) see it at once.
        const call = withKnownRevs(action, (state) => this.core.knownRev(state));
        this.settling += 1;
        try {
          const reply = await this.script(call.script, call.keys, call.args, connection);
          this.core.handle({ kind: "ScriptReplied", reply, tag: null });
          await this.run(this.drain());
          return { kind: "Settled", reply };
        } finally {
          this.settling -= 1;
        }
      }
      case "ReportDropped":
        if (this.onDropped === null) {
          this.log.warn(`outpost dropped ${action.events.length} events: ${action.reason}`);
        } else {
          try {
            await this.onDropped([...action.events], action.reason);
          } catch (exc) {
            this.log.warn(`outpost: onDropped threw ${String(exc)}`);
          }
        }
        return { kind: "Reported" };
      case "RefreshClaim": {
        const byStream = new Map<string, string[]>();
        for (const [stream, id] of action.entries) byStream.set(stream, [...(byStream.get(stream) ?? []), id]);
        for (const [stream, ids] of byStream) await connection.call("XCLAIM", stream, GROUP, this.consumer, 0, ...ids, "JUSTID");
        return { kind: "Done" };
      }
      case "ClaimStale": {
        const entries: [string, string, Map<string, string>][] = [];
        for (const stream of this.outboxes) {
          const reply = (await connection.call("XAUTOCLAIM", stream, GROUP, this.consumer, Math.trunc(action.minIdle * 1000), "0-0", "COUNT", action.count)) as [string, [string, string[] | null][]];
          for (const [id, flat] of reply[1] ?? []) if (Array.isArray(flat)) entries.push([stream, id, pairs(flat)]);
        }
        return { kind: "OutboxRead", entries };
      }
      case "Sleep": {
        const version = this.deliveryWake.version;
        await this.deliveryWake.wait(version, Math.min(action.until - monotonic(), POLL));
        return { kind: "Done" };
      }
      case "Beat":
        await connection.set(action.key, "1", "PX", action.ttlMs);
        return { kind: "Done" };
      case "SurveyConsumers": {
        const listing: [string, unknown][] = [];
        for (const stream of this.outboxes) listing.push([stream, await connection.xinfo("CONSUMERS", stream, GROUP)]);
        return { kind: "ConsumersListed", listing };
      }
      case "CheckHeartbeats": {
        // On a cluster the heartbeats' slots differ: one GET each.
        const values = this.cluster === null ? await connection.mget(...action.keys) : await Promise.all(action.keys.map((key) => connection.get(key)));
        return { kind: "HeartbeatsChecked", values };
      }
      case "Reclaim": {
        const reply = await this.script("reclaim", [action.stream], [GROUP, action.taker, String(action.count), ...action.consumers], connection, true);
        return { kind: "Reclaimed", stream: action.stream, reply };
      }
      case "TakeRequest": {
        // "": Redis's clock
        const reply = await this.script("budget", [action.key], [String(action.perMinute), String(action.capacity), ""], connection, true);
        return { kind: "BudgetAnswered", reply };
      }
      case "ForgetHeartbeat":
        await connection.del(action.key);
        return { kind: "Done" };
    }
  }

  /** A ReadOutbox: a loop's read, or the one beside its post (the re-read of this consumer's
   * pending entries first, when one is due and no loop holds entries). */
  private async readOutbox(action: ReadOutbox, connection: Redis | Cluster): Promise<OutboxRead> {
    const reread = this.recovery.nextRead(this.deliveries.every((delivery) => delivery.idle));
    this.recovery.readStarted();
    const waiting = reread === "waiting" && action.block > 0;
    let read: OutboxRead;
    try {
      if (reread === "now") return await this.readOwnPending(action.count, connection);
      // Due to re-read while another loop reads or holds entries: read what is there without
      // blocking (a blocking read here would keep that loop from the re-read, each loop in
      // turn), then rest uncounted as reading below, so one finds none reading.
      read = await this.readNew(action.count, waiting ? 0 : action.block, connection);
    } finally {
      this.recovery.readEnded();
    }
    if (waiting && !read.entries.length) await this.deliveryWake.wait(this.deliveryWake.version, Math.min(action.block, POLL));
    return read;
  }

  /** XREADGROUP ... 0: the entries delivered to this consumer and not acknowledged, one stream
   * at a time (a cluster refuses a read across slots). */
  private async readOwnPending(count: number, connection: Redis | Cluster): Promise<OutboxRead> {
    const client = this.cluster ?? connection;
    const xreadgroup = client.xreadgroup.bind(client) as unknown as (...a: (string | number)[]) => Promise<unknown>;
    const entries: [string, string, Map<string, string>][] = [];
    for (const stream of this.outboxes) {
      const reply = (await xreadgroup("GROUP", GROUP, this.consumer, "COUNT", count - entries.length, "STREAMS", stream, "0")) as [string, [string, string[] | null][]][] | null;
      for (const [name, listing] of reply ?? []) {
        for (const [id, flat] of listing ?? []) if (Array.isArray(flat)) entries.push([name, id, pairs(flat)]);
      }
      if (entries.length >= count) {
        this.recovery.morePending(); // the next read at rest looks again
        break;
      }
    }
    return { kind: "OutboxRead", entries };
  }

  /** XREADGROUP ... >: entries no consumer was given yet, blocking at most `block` seconds. */
  private async readNew(count: number, block: number, connection: Redis | Cluster): Promise<{ kind: "OutboxRead"; entries: [string, string, Map<string, string>][] }> {
    if (this.cluster !== null) return this.readOutboxesOneByOne(count, block);
    const blockMs = Math.trunc(block * 1000);
    const args: (string | number)[] = ["GROUP", GROUP, this.consumer, "COUNT", count];
    if (blockMs > 0) args.push("BLOCK", blockMs);
    args.push("STREAMS", ...this.outboxes, ...this.outboxes.map(() => ">"));
    // (ioredis's generic call() unwraps a one-stream answer: use the command's own method)
    const xreadgroup = connection.xreadgroup.bind(connection) as unknown as (...a: (string | number)[]) => Promise<unknown>;
    const reply = (await xreadgroup(...args)) as [string, [string, string[] | null][]][] | null;
    const entries: [string, string, Map<string, string>][] = [];
    for (const [stream, listing] of reply ?? []) {
      for (const [id, flat] of listing ?? []) if (Array.isArray(flat)) entries.push([stream, id, pairs(flat)]);
    }
    return { kind: "OutboxRead", entries };
  }

  /** A cluster refuses one read across slots: each shard's stream is read on its own (up to
   * `count` entries each, as one read of every stream gives on one Redis; starting with a random
   * one, so no shard always goes first), and an empty round waits before the next:
   * 50 ms after entries came, twice as long after each empty round, up to the read's block (an
   * idle instance read every stream 20 times a second). */
  private async readOutboxesOneByOne(count: number, block: number): Promise<{ kind: "OutboxRead"; entries: [string, string, Map<string, string>][] }> {
    const entries: [string, string, Map<string, string>][] = [];
    const outboxes = this.outboxes;
    const start = Math.floor(Math.random() * outboxes.length);
    for (let offset = 0; offset < outboxes.length; offset++) {
      const stream = outboxes[(start + offset) % outboxes.length] as string;
      const xreadgroup = this.redis.xreadgroup.bind(this.redis) as unknown as (...a: (string | number)[]) => Promise<unknown>;
      const reply = (await xreadgroup("GROUP", GROUP, this.consumer, "COUNT", count, "STREAMS", stream, ">")) as [string, [string, string[] | null][]][] | null;
      for (const [name, listing] of reply ?? []) {
        for (const [id, flat] of listing ?? []) if (Array.isArray(flat)) entries.push([name, id, pairs(flat)]);
      }
    }
    if (entries.length) {
      this.emptyRounds = 0;
    } else if (block > 0) {
      const idle = CLUSTER_POLL * 2 ** Math.min(this.emptyRounds, IDLE_DOUBLINGS);
      if (block >= idle) this.emptyRounds += 1; // a round asked to block less (a flush's) is not idleness
      await this.deliveryWake.wait(this.deliveryWake.version, Math.min(block, idle));
    }
    return { kind: "OutboxRead", entries };
  }

  private async post(body: Uint8Array): Promise<BatchAnswered | BatchFailed> {
    let response: Response;
    try {
      response = await fetch(new URL("/v1/events/ingest", this.serverUrl), {
        method: "POST",
        body,
        headers: { authorization: `Bearer ${this.accessToken}`, "content-type": "application/json", "user-agent": USER_AGENT },
        signal: AbortSignal.any([AbortSignal.timeout(30_000), this.closing.signal]),
      });
    } catch (exc) {
      const code = (exc as { cause?: { code?: string } }).cause?.code ?? "";
      const refused = ["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH", "UND_ERR_CONNECT_TIMEOUT"];
      if (refused.includes(code)) return { kind: "BatchFailed", reason: `could not connect to Polar: ${code}`, maybeSent: false };
      return { kind: "BatchFailed", reason: `ingestion request failed: ${String(exc)}`, maybeSent: true };
    }
    let content: Uint8Array;
    try {
      content = await readAtMost(response, MAX_ANSWER);
    } catch (exc) {
      return { kind: "BatchFailed", reason: `ingestion request failed: ${String(exc)}`, maybeSent: true };
    }
    const wait = retryAfter(response.headers.get("retry-after"), this.nowUs());
    return { kind: "BatchAnswered", status: response.status, body: content, retryAfter: wait };
  }

  private async createGroups(client: Redis | Cluster): Promise<void> {
    for (const stream of this.outboxes) {
      try {
        await client.xgroup("CREATE", stream, GROUP, "0", "MKSTREAM");
      } catch (exc) {
        if (!String(exc).includes("BUSYGROUP")) throw exc;
      }
    }
  }

  /** The last entry of each outbox now: what a flush waits to see delivered. */
  private async outboxMarks(): Promise<Map<string, EntryId>> {
    // All at once: one connection writes the commands back to back (a cluster: each to its node).
    const replies = await this.readOutboxes(() => Promise.all(this.outboxes.map((stream) => this.redis.xrevrange(stream, "+", "-", "COUNT", 1))));
    return lastEntries(this.outboxes, replies);
  }

  /** `read()` for a flush, tried again a few times on a Redis failure (a connection kept from
   * before Redis came back may fail once); past that, RedisUnavailable. A bug is thrown as it is. */
  private async readOutboxes<T>(read: () => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      try {
        reachable(this.redis);
        return await read();
      } catch (exc) {
        const unavailable = redisUnavailable("reading the outboxes", exc, this.redis);
        if (attempt >= FLUSH_READS) throw unavailable;
        await this.pause(POLL);
      }
    }
  }

  /** Per stream the flush still waits for, whether an entry up to its mark is left (all read at
   * once, as the marks are). */
  private async outboxLeft(marks: ReadonlyMap<string, EntryId>): Promise<Map<string, boolean>> {
    const streams = [...marks];
    const replies = await this.readOutboxes(() => Promise.all(streams.map(([stream, mark]) => this.redis.xrange(stream, "-", mark, "COUNT", 1))));
    return new Map(streams.map(([stream], i) => [stream, (replies[i] ?? []).length > 0]));
  }

  private syncCounts(): [number, number] {
    const remote = this.core.remote;
    return remote === null ? [0, 0] : [remote.snapshotsReceived, remote.snapshotsApplied];
  }

  private nowUs(): number {
    return this.clock === null ? wallUs() : toUs(this.clock.now());
  }
}

/** What a delivery loop may be doing that gives this consumer entries or settles some. */
/** What changes this consumer's pending entries as a read does: a re-read of them waits while a
 * loop does one. (A ReadOutbox counts itself, once it knows which read it does.) */
const MOVES_ENTRIES = new Set<DeliveryEffect["kind"]>(["ClaimStale", "Reclaim", "SettleScript", "SettleScripts", "PostAndSettle"]);
const SETTLED: DeliveryAnswer = { kind: "Settled", reply: null };

function pairs(flat: string[]): Map<string, string> {
  const out = new Map<string, string>();
  for (let i = 0; i + 1 < flat.length; i += 2) out.set(flat[i] as string, flat[i + 1] as string);
  return out;
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

/** Resolves once every one of `work` settled; then rejects with the first failure, if any. */
async function allEnded(work: readonly Promise<unknown>[]): Promise<void> {
  const failed = (await Promise.allSettled(work)).find((outcome) => outcome.status === "rejected");
  if (failed !== undefined) throw failed.reason;
}

/** An exception for the log: its stack (which starts with its name and message) when it has one. */
function stackOf(exc: unknown): string {
  return exc instanceof Error ? (exc.stack ?? exc.message) : String(exc);
}

/** A Redis failure's text for the log (one given as a string stays as it came). */
function errorText(exc: unknown, client: Redis | Cluster): string {
  return typeof exc === "string" ? exc : describe(exc, client);
}
