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
import { Redis } from "ioredis";
import { Balance } from "../core/balance.js";
import { Delivery, type DeliverySettings, GROUP, type DeliveryEffect, type DeliveryInput, makeDeliverySettings, nothingDone, retryAfter, withKnownRevs } from "../core/delivery.js";
import type { Effect, Fetch, RunScript } from "../core/effects.js";
import { Echoes } from "../core/echoes.js";
import { eventIdOf, timestampUsOf } from "../core/event.js";
import { type ForgetHeartbeat, handBack } from "../core/liveness.js";
import { Outage, type Report } from "../core/outage.js";
import { InvalidEvent, NotReady, OutpostClosed, RedisUnavailable, UnknownMeter, UnsupportedMeter, UsageError } from "../core/errors.js";
import type { Input } from "../core/inputs.js";
import { ALL_OUTBOXES, CONFIGURATION_KEY, allChannels, namespaceOfDatabase } from "../core/keys.js";
import { Link, Target } from "../core/link.js";
import { SCRIPT_SHA1, SCRIPT_TEXT } from "../core/scripts.generated.js";
import { type Logger, Session, makeSettings } from "../core/session.js";
import { toUs } from "../core/time.js";
import type { RawFields } from "../core/inputs.js";
import { Signal, monotonic, sleep, wallUs } from "./signal.js";
import { Telemetry, customerAttribute } from "./telemetry.js";
import { Traces } from "./traces.js";

export const DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0";
export const DEFAULT_SERVER_URL = "https://api.polar.sh";
const POLL = 0.25; // seconds between two looks at the core's deadlines
const SETTLE = 0.1; // seconds a waiting read sleeps at most between two looks at its copy
const USER_AGENT = "outpost-node/0.1.0";

export type DroppedCallback = (events: unknown[], reason: string) => unknown;

export interface Clock {
  now(): Date;
}

export interface OutpostOptions {
  /** Polar organization access token (default: env POLAR_ACCESS_TOKEN). */
  accessToken?: string;
  /** Redis to keep the state in (default: env REDIS_URL, else local Redis). */
  redisUrl?: string;
  /** An existing ioredis client to use instead of redisUrl; close() does not close it. */
  redis?: Redis;
  /** Polar's API (default: env POLAR_SERVER_URL, else https://api.polar.sh). */
  serverUrl?: string;
  /** Seconds a first read waits for Polar's snapshot before NotReady. */
  snapshotTimeout?: number;
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
  /** A directory to write conformance traces to (session.jsonl, delivery-<n>.jsonl): every input
   * of the core and its answers, replayable by this core and the Python one. Debugging only. */
  recordTo?: string;
}

export interface TrackOptions {
  externalCustomerId?: string;
  customerId?: string;
  metadata?: Record<string, unknown>;
  timestamp?: Date;
  eventId?: string;
}

export interface CustomerOptions {
  externalCustomerId?: string;
  customerId?: string;
  /** Read Redis, never memory: the answer counts everything any instance tracked before the
   * call (one round trip; Balance.source is "redis"). */
  fresh?: boolean;
}

const CONSOLE: Logger = {
  debug: () => {},
  warn: (message) => console.warn(message),
};

interface LinkSocket {
  socket: Socket;
  reported: boolean;
}

export class Outpost {
  private readonly redis: Redis;
  private readonly ownsRedis: boolean;
  private readonly channels: string[];
  private readonly accessToken: string | null;
  private readonly serverUrl: string;
  private readonly core: Session;
  private readonly log: Logger;
  private readonly deliverySettings: DeliverySettings;
  private readonly maxInFlight: number;
  private readonly onDropped: DroppedCallback | null;
  private readonly deliveries: Delivery[] = [];
  private readonly connections: Redis[] = [];
  private readonly telemetry: Telemetry;
  private readonly clock: Clock | null;
  private readonly traces: Traces;
  private readonly signal = new Signal();
  private readonly echoes = new Echoes();
  private readonly consumer = `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  private readonly workers: Promise<void>[] = [];
  /** Aborts the ingestion requests in flight when the instance closes. */
  private readonly closing = new AbortController();
  private subscriber: Redis | null = null;
  private link: LinkSocket | null = null;
  private flushing = 0;
  private settling = 0;
  private starting: Promise<void> | null = null;
  private closed = false;
  private readonly stateOutage = new Outage("loading state");
  private readonly subscriberOutage = new Outage("the change subscription");

  constructor(options: OutpostOptions = {}) {
    const maxInFlight = options.maxInFlight ?? 1;
    if (maxInFlight < 1) throw new UsageError("max_in_flight must be at least 1");
    this.log = options.logger ?? CONSOLE;
    this.ownsRedis = options.redis === undefined;
    this.redis = options.redis ?? connectRedis(options.redisUrl ?? process.env.REDIS_URL ?? DEFAULT_REDIS_URL);
    // Pub/sub ignores numbered databases: name the channels after ours.
    const namespace = namespaceOfDatabase(Number(this.redis.options.db ?? 0));
    this.channels = allChannels(namespace);
    this.accessToken = options.accessToken ?? process.env.POLAR_ACCESS_TOKEN ?? null;
    this.serverUrl = options.serverUrl ?? process.env.POLAR_SERVER_URL ?? DEFAULT_SERVER_URL;
    this.traces = new Traces(options.recordTo ?? null);
    const link = this.accessToken ? new Link(Target.of(this.serverUrl), this.accessToken, this.traces.rng(0), (n) => randomBytes(n)) : null;
    const settings = makeSettings({ snapshotTimeout: options.snapshotTimeout ?? 5.0, channelNamespace: namespace });
    this.core = this.traces.session(new Session(settings, this.log, link), settings, link === null ? null : this.serverUrl);
    const claimIdle = options.claimIdle ?? 300;
    this.deliverySettings = makeDeliverySettings({
      batchSize: options.batchSize ?? 500,
      linger: options.linger ?? 0.2,
      maxAttempts: options.maxAttempts ?? 10,
      claimIdle,
      claimInterval: Math.min(30, claimIdle / 2),
      backoffBase: options.retryBase ?? 0.5,
      channelNamespace: namespace,
      consumer: this.consumer,
      heartbeat: options.heartbeat ?? 10.0,
      requestsPerMinute: options.requestsPerMinute ?? 300.0,
      batchBytes: options.batchBytes ?? 8 * 1024 * 1024,
    });
    this.maxInFlight = maxInFlight;
    this.onDropped = options.onDropped ?? null;
    this.telemetry = new Telemetry(
      (options.telemetry ?? true) && process.env.POLAR_OUTPOST_TELEMETRY !== "0",
      { url: options.telemetryUrl ?? this.serverUrl, token: this.accessToken, interval: options.telemetryInterval ?? 30 },
      (message) => this.log.warn(message),
    );
    this.clock = options.clock ?? null;
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
    await this.readCachedConfiguration();
    this.subscribe();
    this.workers.push(this.tickLoop());
    if (this.accessToken) {
      for (let n = 0; n < this.maxInFlight; n++) {
        const started = monotonic();
        const delivery = this.traces.delivery(n, new Delivery(this.deliverySettings, this.traces.rng(n + 1), started), this.deliverySettings, started);
        this.deliveries.push(delivery);
        // A blocking XREADGROUP needs a connection of its own: ioredis pipelines one socket.
        const connection = this.redis.duplicate();
        connection.on("error", () => {});
        this.connections.push(connection);
        this.workers.push(this.deliveryLoop(delivery, connection, n));
      }
    } else {
      this.log.warn("outpost has no access token: events stay queued in Redis until an instance with a token delivers them");
    }
  }

  /** Deliver every event queued when the call started, by any instance. Resolves true once each
   * was delivered or dropped (and reported), false if some were still queued after `timeout`
   * seconds (they stay queued, nothing is lost). */
  async flush(timeout = 10.0): Promise<boolean> {
    await this.ensureStarted();
    const marks = await this.outboxMarks();
    const deadline = monotonic() + timeout;
    this.flushing += 1;
    this.signal.fire();
    try {
      for (;;) {
        const version = this.signal.version;
        if (!this.settling && (await this.outboxSettled(marks))) return true;
        const remaining = deadline - monotonic();
        if (remaining <= 0) return false;
        await this.signal.wait(version, Math.min(remaining, 0.05));
      }
    } finally {
      this.flushing -= 1;
    }
  }

  /** Flush (up to `timeout` seconds), stop the background work and release connections. Safe to
   * call twice. */
  async close(timeout = 10.0): Promise<void> {
    if (this.closed) return;
    if (this.starting !== null && this.deliveries.length) {
      try {
        await this.flush(timeout);
      } catch {
        // Redis down: the events stay queued in Redis for another instance
      }
    }
    this.feed({ kind: "Closing" }); // a close frame to Polar while the socket is still open
    this.closed = true;
    this.closing.abort();
    this.signal.fire();
    const link = this.link;
    this.link = null;
    if (link !== null) {
      link.reported = true;
      link.socket.end(); // after the close frame Closing queued; destroyed if Polar lingers
      setTimeout(() => link.socket.destroy(), 1000).unref();
    }
    this.subscriber?.disconnect();
    await Promise.allSettled(this.workers);
    if (this.deliveries.length) await this.handBack(this.connections[0] as Redis);
    for (const connection of this.connections) connection.disconnect();
    await this.telemetry.shutdown(monotonic(), ...this.syncCounts());
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

  private async trackNow(name: string, options: TrackOptions): Promise<[string, RunScript]> {
    const nowUs = this.nowUs();
    const timestampUs = timestampUsOf(options.timestamp, nowUs);
    const eventId = eventIdOf(options.eventId, randomUUID().replaceAll("-", ""));
    const args = {
      name,
      externalCustomerId: options.externalCustomerId,
      customerId: options.customerId,
      metadata: options.metadata,
      timestampUs,
      nowUs,
      eventId,
    };
    let run: RunScript;
    try {
      run = this.core.track(args);
    } catch (exc) {
      if (!(exc instanceof NotReady)) throw exc;
      await this.waitForConfiguration();
      run = this.core.track(args);
    }
    const reply = await this.script(run.script, run.keys, run.args);
    this.echoes.expect(reply);
    this.core.handle({ kind: "ScriptReplied", reply, tag: null });
    const effects = this.core.effects();
    if (effects.length) await this.run(effects);
    return [eventId, run];
  }

  private async script(name: string, keys: string[], args: string[], client: Redis = this.redis, raw = false): Promise<unknown> {
    if (raw) return this.evalScript(name, keys, args, client);
    try {
      return await this.evalScript(name, keys, args, client);
    } catch (exc) {
      throw new RedisUnavailable(`Redis failed running ${name}: ${String(exc)}`);
    }
  }

  private async evalScript(name: string, keys: string[], args: string[], client: Redis): Promise<unknown> {
    try {
      return await client.evalsha(SCRIPT_SHA1[name] as string, keys.length, ...keys, ...args);
    } catch (exc) {
      if (!String(exc).includes("NOSCRIPT")) throw exc;
      return await client.eval(SCRIPT_TEXT[name] as string, keys.length, ...keys, ...args);
    }
  }

  private async waitForConfiguration(): Promise<void> {
    const deadline = monotonic() + this.core.settings.snapshotTimeout;
    while (this.core.configuration === null) {
      const remaining = deadline - monotonic();
      if (remaining <= 0) throw new NotReady("no configuration from Polar yet: cannot tell which meters count the event");
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

  private async balanceWhenReady(meterId: string, external: string | null, internal: string | null, fresh: boolean): Promise<Balance> {
    await this.ensureStarted();
    const deadline = monotonic() + this.core.settings.snapshotTimeout;
    for (;;) {
      const version = this.signal.version;
      const remaining = deadline - monotonic();
      // At the deadline, a copy still waiting for the subscription reads Redis.
      const found = this.core.read(meterId, external, internal, fresh || remaining <= 0);
      const effects = this.core.effects();
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
      if (remaining <= 0) {
        const reason = this.core.notReadyReason(meterId, external, internal);
        throw new NotReady(`${reason} after ${this.core.settings.snapshotTimeout} s`);
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
      throw new RedisUnavailable(`Redis failed reading ${fetch.keys.join(", ")}: ${String(exc)}`);
    }
    const found = this.core.readFetched(meterId, external, internal, fields);
    const effects = this.core.effects();
    if (effects.length) await this.run(effects);
    return found;
  }

  private async hgetallEach(keys: string[]): Promise<Map<string, RawFields>> {
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
              await this.redis.set(effect.key, effect.text);
            } catch (exc) {
              this.log.warn(`outpost could not cache the configuration: ${String(exc)}`);
            }
            break;
          case "RunScript": {
            let reply: unknown;
            try {
              reply = await this.script(effect.script, effect.keys, effect.args);
            } catch (exc) {
              this.redisFailed(this.stateOutage, exc);
              if (effect.tag !== null) this.core.handle({ kind: "ScriptFailed", tag: effect.tag });
              continue;
            }
            this.redisAnswered(this.stateOutage);
            this.core.handle({ kind: "ScriptReplied", reply, tag: effect.tag });
            this.echoes.expect(reply); // applied: its echo, if it has not come yet, is dropped
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
        }
      }
      effects = this.core.effects();
    }
    const seen = this.core.observations();
    if (seen.length) this.telemetry.observe(seen);
    this.signal.fire();
  }

  /** Count a Redis failure of one loop; log what the outage says; return the delay. */
  private redisFailed(outage: Outage, exc: unknown): number {
    const [delay, report] = outage.failed(monotonic(), String(exc), Math.random());
    this.logReport(report);
    return delay;
  }

  private redisAnswered(outage: Outage): void {
    if (outage.down) this.logReport(outage.succeeded(monotonic()));
  }

  private logReport(report: Report | null): void {
    if (report === null) return;
    if (report.level === "warning") this.log.warn(report.message);
    else (this.log.info ?? this.log.debug).call(this.log, report.message);
  }

  /** Hand one input to the core and run what it asks for (in the background). */
  private feed(input: Input): void {
    this.core.handle(input);
    const effects = this.core.effects();
    if (effects.length || input.kind !== "Tick") {
      this.run(effects).catch((exc: unknown) => this.log.warn(`outpost: ${String(exc)}`));
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
      fields = await this.redis.hgetall(key);
    } catch (exc) {
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
      const pipeline = this.redis.pipeline();
      for (const key of keys) pipeline.hkeys(key);
      const replies = (await pipeline.exec()) ?? [];
      keys.forEach((key, i) => {
        const [error, names] = replies[i] ?? [new Error("no reply"), null];
        if (error) throw error;
        fields.set(key, names as unknown[]);
      });
    } catch (exc) {
      this.log.warn(`outpost could not list pending events: ${String(exc)}`);
      this.core.handle({ kind: "ListFailed", tag });
      return;
    }
    this.core.handle({ kind: "PendingListed", tag, fields });
  }

  private async readCachedConfiguration(): Promise<void> {
    let text: string | null;
    try {
      text = await this.redis.get(CONFIGURATION_KEY);
    } catch (exc) {
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
    await this.run(this.core.effects());
  }

  // -- Redis's change channels ----------------------------------------------------------------

  /** Follow every shard's change channel; after any (re)subscription, reload the copies. */
  private subscribe(): void {
    const subscriber = this.redis.duplicate({ autoResubscribe: false, maxRetriesPerRequest: null });
    this.subscriber = subscriber;
    let failed = false; // this break of the subscription is reported already
    subscriber.on("error", (exc: unknown) => {
      if (this.closed || failed) return;
      failed = true;
      this.redisFailed(this.subscriberOutage, exc);
    });
    subscriber.on("close", () => {
      // Until Redis confirms the subscription again, no copy follows it: reads go to Redis.
      if (this.core.subscribed) this.feed({ kind: "SubscriberLost" });
    });
    subscriber.on("smessage", (_channel: string, message: string) => {
      if (this.echoes.seen(message)) return; // this instance's own change, already applied
      this.core.handle({ kind: "ChangePublished", data: message });
      this.core.handle({ kind: "Tick", now: monotonic(), wallUs: this.nowUs() });
      this.run(this.core.effects()).catch((exc: unknown) => this.log.warn(`outpost: ${String(exc)}`));
    });
    subscriber.on("ready", () => {
      subscriber.ssubscribe(...this.channels).then(
        (count) => {
          if (this.closed) return;
          // ioredis resolves once Redis confirmed every channel: the last confirmation's count.
          this.feed({ kind: "SubscriptionConfirmed", count: Number(count) });
          failed = false;
          if (this.core.subscribed) this.redisAnswered(this.subscriberOutage);
        },
        (exc: unknown) => {
          failed = true;
          this.redisFailed(this.subscriberOutage, exc);
        },
      );
    });
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
    const timer = setTimeout(() => fail("cannot connect: timed out"), timeout * 1000);
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
      fail(opened ? `connection lost: ${exc.message}` : `cannot connect: ${exc.message}`);
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

  private async deliveryLoop(delivery: Delivery, connection: Redis, number: number): Promise<void> {
    const outage = new Outage(`delivery ${number}`);
    await this.retrying(outage, () => this.createGroups(connection), undefined); // Redis may be down at start
    while (!this.closed) {
      delivery.flushing = this.flushing > 0;
      const action = delivery.nextEffect(monotonic());
      const outcome = await this.act(outage, action, connection);
      delivery.handle(outcome, monotonic(), this.nowUs());
      for (const report of delivery.reports()) this.logReport(report);
      if (outcome.kind === "Settled") this.signal.fire();
    }
  }

  /** Do one delivery action. Redis failures are retried until they succeed (or the instance
   * closes): settling must not be skipped, and a read can simply wait. */
  private act(outage: Outage, action: DeliveryEffect, connection: Redis): Promise<DeliveryInput> {
    const nothing: DeliveryInput =
      action.kind === "PostBatch"
        ? { kind: "BatchFailed", reason: "closing", maybeSent: false }
        : action.kind === "ReportDropped"
          ? { kind: "Reported" }
          : nothingDone(action);
    return this.retrying(outage, () => this.actOnce(action, connection), nothing);
  }

  /** call() until Redis answers, backing off; `closing` (nothing done, the work stays queued in
   * Redis) once the instance is closing. */
  private async retrying<T>(outage: Outage, call: () => Promise<T>, closing: T): Promise<T> {
    for (;;) {
      let result: T;
      try {
        result = await call();
      } catch (exc) {
        if (this.closed) return closing;
        const text = String(exc);
        if (text.includes("NOGROUP") || text.includes("no such key")) {
          // Redis lost its data (a restart without AOF, FLUSHDB): a read says NOGROUP, a survey
          // (XINFO) "no such key". A failure here is retried too.
          await this.createGroups(this.redis).catch(() => {});
          await sleep(0.05);
        } else {
          await sleep(this.redisFailed(outage, exc));
        }
        continue;
      }
      this.redisAnswered(outage);
      return result;
    }
  }

  /** Once the loops stopped: this instance's heartbeat goes, so other instances take what it
   * still holds at their next survey, and it leaves the group where it holds nothing. */
  private async handBack(connection: Redis): Promise<void> {
    try {
      for (const action of handBack(this.consumer)) await this.actOnce(action, connection);
    } catch (exc) {
      this.log.warn(`outpost could not hand back its outbox entries (others take them once its heartbeat expires): ${String(exc)}`);
    }
  }

  private async actOnce(action: DeliveryEffect | ForgetHeartbeat, connection: Redis): Promise<DeliveryInput> {
    switch (action.kind) {
      case "ReadOutbox": {
        const block = Math.trunc(action.block * 1000);
        const args: (string | number)[] = ["GROUP", GROUP, this.consumer, "COUNT", action.count];
        if (block > 0) args.push("BLOCK", block);
        args.push("STREAMS", ...ALL_OUTBOXES, ...ALL_OUTBOXES.map(() => ">"));
        // (ioredis's generic call() unwraps a one-stream answer: use the command's own method)
        const xreadgroup = connection.xreadgroup.bind(connection) as unknown as (...a: (string | number)[]) => Promise<unknown>;
        const reply = (await xreadgroup(...args)) as [string, [string, string[] | null][]][] | null;
        const entries: [string, string, Map<string, string>][] = [];
        for (const [stream, listing] of reply ?? []) {
          for (const [id, flat] of listing ?? []) if (Array.isArray(flat)) entries.push([stream, id, pairs(flat)]);
        }
        return { kind: "OutboxRead", entries };
      }
      case "PostBatch":
        return this.post(action.body);
      case "SettleScript": {
        // Told which revisions this instance holds, the script replies with what changed, so
        // this instance's copies (and a flush() waiting on them) see it at once.
        const call = withKnownRevs(action, (state) => this.core.knownRev(state));
        this.settling += 1;
        try {
          const reply = await this.script(call.script, call.keys, call.args, connection);
          this.core.handle({ kind: "ScriptReplied", reply, tag: null });
          this.echoes.expect(reply);
          await this.run(this.core.effects());
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
        for (const stream of ALL_OUTBOXES) {
          const reply = (await connection.call("XAUTOCLAIM", stream, GROUP, this.consumer, Math.trunc(action.minIdle * 1000), "0-0", "COUNT", action.count)) as [string, [string, string[] | null][]];
          for (const [id, flat] of reply[1] ?? []) if (Array.isArray(flat)) entries.push([stream, id, pairs(flat)]);
        }
        return { kind: "OutboxRead", entries };
      }
      case "Sleep": {
        const version = this.signal.version;
        await this.signal.wait(version, Math.min(action.until - monotonic(), POLL));
        return { kind: "Done" };
      }
      case "Beat":
        await connection.set(action.key, "1", "PX", action.ttlMs);
        return { kind: "Done" };
      case "SurveyConsumers": {
        const listing: [string, unknown][] = [];
        for (const stream of ALL_OUTBOXES) listing.push([stream, await connection.xinfo("CONSUMERS", stream, GROUP)]);
        return { kind: "ConsumersListed", listing };
      }
      case "CheckHeartbeats":
        return { kind: "HeartbeatsChecked", values: await connection.mget(...action.keys) };
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

  private async post(body: Uint8Array): Promise<DeliveryInput> {
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
      content = new Uint8Array(await response.arrayBuffer());
    } catch (exc) {
      return { kind: "BatchFailed", reason: `ingestion request failed: ${String(exc)}`, maybeSent: true };
    }
    const wait = retryAfter(response.headers.get("retry-after"), this.nowUs());
    return { kind: "BatchAnswered", status: response.status, body: content, retryAfter: wait };
  }

  private async createGroups(client: Redis): Promise<void> {
    for (const stream of ALL_OUTBOXES) {
      try {
        await client.xgroup("CREATE", stream, GROUP, "0", "MKSTREAM");
      } catch (exc) {
        if (!String(exc).includes("BUSYGROUP")) throw exc;
      }
    }
  }

  private async outboxMarks(): Promise<Map<string, string>> {
    const marks = new Map<string, string>();
    for (const stream of ALL_OUTBOXES) {
      const last = await this.redis.xrevrange(stream, "+", "-", "COUNT", 1);
      if (last.length && last[0]) marks.set(stream, last[0][0]);
    }
    return marks;
  }

  private async outboxSettled(marks: Map<string, string>): Promise<boolean> {
    for (const [stream, mark] of marks) {
      if ((await this.redis.xrange(stream, "-", mark, "COUNT", 1)).length) return false;
    }
    return true;
  }

  private syncCounts(): [number, number] {
    const remote = this.core.remote;
    return remote === null ? [0, 0] : [remote.snapshotsReceived, remote.snapshotsApplied];
  }

  private nowUs(): number {
    return this.clock === null ? wallUs() : toUs(this.clock.now());
  }
}

function pairs(flat: string[]): Map<string, string> {
  const out = new Map<string, string>();
  for (let i = 0; i + 1 < flat.length; i += 2) out.set(flat[i] as string, flat[i + 1] as string);
  return out;
}

function connectRedis(url: string): Redis {
  const client = new Redis(url, { maxRetriesPerRequest: 2 });
  client.on("error", () => {}); // each failed command reports it; ioredis reconnects by itself
  return client;
}
