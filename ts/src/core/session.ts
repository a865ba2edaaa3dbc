/** The Outpost state machine: everything the drivers do not need sockets for
 * (outpost_core/_session.py; its docstring explains the flows).
 *
 * Inputs go through handle(); the requests the core makes of the driver accumulate in an outbox
 * the driver drains with effects(), then runs, then reports back. Peer misbehaviour (garbage in
 * Redis, a malformed message) is never raised: it is counted in `rejections` and reported. The
 * session never logs: what its driver should log it queues as Report lines, which the driver
 * drains with reports(). Caller mistakes raise at once. */

import { formatNumber } from "./aggregate.js";
import { backoff } from "./backoff.js";
import { type Balance, computeBalance, holdExpiry, mergedState } from "./balance.js";
import { type Change, Malformed, parseChanges, textOf } from "./changes.js";
import { type Configuration, type Reducer, parseConfiguration } from "./configuration.js";
import { type Effect, type Fetch, type RunScript, runScript } from "./effects.js";
import { InvalidEvent, NotReady, UnknownMeter, UnsupportedMeter, UsageError } from "./errors.js";
import { buildEvent, customerOf } from "./event.js";
import { InvalidDefinition } from "./filters.js";
import { Deadlines } from "./deadlines.js";
import { Echoes } from "./echoes.js";
import { Following, Pacer } from "./following.js";
import type { Input, RawFields } from "./inputs.js";
import { CONFIGURATION_KEY, type Customer, DEFAULT_SHARDS, allChannels, bucketKey, channel, outboxKey, shardOf, stateKey } from "./keys.js";
import { checkedShards } from "./shards.js";
import { type Link, LinkState } from "./link.js";
import { type IdentityState, Mirror, Offer, deriveState, unreadableFields } from "./mirror.js";
import { Outage, type Report } from "./outage.js";
import { Reports } from "./reports.js";
import type { Observation } from "./observations.js";
import { repr, reprFloat, reprString } from "./pyrepr.js";
import type { Random } from "./random.js";
import { type Host, Remote } from "./remote.js";
import { HOUR_US, floorBucket } from "./time.js";

/** The largest magnitude track() accepts for a value a reducer counts: Lua sums a bucket's values
 * in doubles, and a few values near 1e308 overflow to inf, which no reader accepts. */
export const MAX_VALUE = 1e300;

export interface Settings {
  /** Seconds a first read waits for its snapshot before NotReady. */
  snapshotTimeout: number;
  /** How long an acknowledged event no snapshot counts stays pending: one hour, as
   * far back as Polar looks for cold_until (docs/design.md). */
  pendingLimitUs: number;
  /** Seconds before a failed load is tried again; doubled (with jitter) for each further failure
   * in a row, up to reloadCap. */
  reloadRetry: number;
  reloadCap: number;
  /** Seconds a load may go unanswered before it is asked again (its reply was lost). */
  loadTimeout: number;
  /** Appended to the change channels (dbN for Redis database N > 0). */
  channelNamespace: string;
  /** The most customers the process follows (a copy, cached balances, a snapshot flow each);
   * beyond it, the least recently read is let go (and Polar told to forget it). */
  maxCustomers: number;
  /** Seconds without a read after which a customer is let go. */
  idleCustomerTtl: number;
  /** After a reconnect or a restarted subscription, the customers read within this many seconds
   * reload (or ask Polar again) at once, paced; the others on their next read. */
  recentWindow: number;
  /** The pace of those reloads and requests: at most this many a second, per kind. */
  reloadRate: number;
  /** Seconds after a snapshot is applied by which Polar has normally pushed the next one: if by
   * then this instance still holds acknowledged events of the customer that no snapshot counted,
   * it asks Polar for one (Polar pushes when its data moves, not when its cold_until passes a
   * bucket it had already counted). null: never ask. */
  refreshAfter: number | null;
  /** The deployment's shard count (shards.ts): which shard, so which keys and channel, each
   * customer has. */
  shards: number;
}

export function makeSettings(overrides: Partial<Settings> = {}): Settings {
  const settings: Settings = {
    snapshotTimeout: 5.0,
    pendingLimitUs: HOUR_US,
    reloadRetry: 0.5,
    reloadCap: 5.0,
    loadTimeout: 10.0,
    channelNamespace: "",
    maxCustomers: 16_000,
    idleCustomerTtl: 900.0,
    recentWindow: 60.0,
    reloadRate: 200.0,
    refreshAfter: 600.0,
    shards: DEFAULT_SHARDS,
    ...overrides,
  };
  if (!(Number.isFinite(settings.snapshotTimeout) && settings.snapshotTimeout >= 0)) {
    throw new UsageError("snapshot_timeout must be a finite number of seconds, not negative");
  }
  for (const [name, value] of [
    ["reload_retry", settings.reloadRetry],
    ["reload_cap", settings.reloadCap],
    ["load_timeout", settings.loadTimeout],
  ] as const) {
    if (!(Number.isFinite(value) && value > 0)) throw new UsageError(`${name} must be a positive, finite number of seconds`);
  }
  if (settings.pendingLimitUs <= 0) throw new UsageError("pending_limit_us must be positive");
  if (!Number.isInteger(settings.maxCustomers)) throw new UsageError("max_customers must be an integer");
  if (settings.maxCustomers < 1) throw new UsageError("max_customers must be at least 1");
  for (const [name, value] of [
    ["idle_customer_ttl", settings.idleCustomerTtl],
    ["recent_window", settings.recentWindow],
    ["reload_rate", settings.reloadRate],
  ] as const) {
    if (!(Number.isFinite(value) && value > 0)) throw new UsageError(`${name} must be a positive, finite number`);
  }
  const refresh = settings.refreshAfter;
  if (refresh !== null && !(Number.isFinite(refresh) && refresh > 0)) {
    throw new UsageError("refresh_after must be a positive, finite number of seconds, or null");
  }
  checkedShards(settings.shards);
  return settings;
}

export interface TrackArgs {
  name: unknown;
  externalCustomerId?: unknown;
  customerId?: unknown;
  metadata?: unknown;
  timestampUs: number;
  nowUs: number;
  eventId: string;
}

/** (meter id, external customer id, customer id): the warm path's lookup key. */
function readKey(meterId: string, externalCustomerId: string | null, customerId: string | null): string {
  return `${meterId}\u0000${externalCustomerId ?? "\u0001"}\u0000${customerId ?? "\u0001"}`;
}

export class Session {
  readonly settings: Settings;
  remote: Remote | null;
  private readonly lines = new Reports();
  configuration: Configuration | null = null;
  private configurationText: string | null = null;
  private configurationFromPolar = false;
  private readonly mirrors = new Map<string, Mirror>();
  /** Each customer's copies (by tag), one per reducer read (an alias change invalidates them). */
  private readonly customerMirrors = new Map<string, Mirror[]>();
  private readonly balances = new Map<string, Balance>();
  private outbox: Effect[] = [];
  private observed: Observation[] = [];
  /** State key → when to ask for its load again (failed, or unanswered for too long). */
  private readonly retryAt = new Deadlines<string>();
  /** The customers followed, by tag (each has copies here and a flow in remote). */
  private readonly following = new Following<Customer>();
  /** Read keys whose cached balance a warm read answered since last looked at: warm reads
   * bypass read(), so a customer they keep busy is told by them, not by its last read. */
  private readonly warmRead = new Set<string>();
  /** Customers let go (with a link), and their aliases then: read again, they answer from Redis
   * at once (this process knows their other names), at most maxCustomers. */
  private readonly letGo = new Map<string, readonly Customer[]>();
  /** State keys to reload at the reload pace (recently read, after a restart). */
  private reloads: string[] = [];
  private readonly reloadPace: Pacer;
  /** The wall clock (µs) of the latest Tick: what reads count holds against. */
  wallUs = 0;
  /** State key → when the first hold a cached balance of it counts expires (wall µs). */
  private readonly holdDue = new Map<string, number>();
  private readonly loadFailures = new Map<string, number>();
  private readonly rng: Random;
  private now = 0;
  /** Whether Redis confirmed the subscription to every shard channel and it holds. */
  subscribed = false;
  everSubscribed = false;
  /** The shards whose channel subscription Redis confirmed and that has not broken since: their
   * copies may follow Redis. */
  private readonly liveShards = new Set<number>();
  /** Each of the deployment's channels and its shard (a channel not there is none of ours). */
  private readonly shardOfChannel: Map<string, number>;
  readonly rejections = new Map<string, number>();
  /** This instance's scripts in flight, the changes held meanwhile, the echoes expected. */
  private readonly echoes = new Echoes();
  private readonly polarOutage = new Outage("the WebSocket", "Polar");

  /** `link` is the WebSocket to Polar; without one (no access token) the session reads whatever
   * snapshots other instances apply to the shared Redis. `rng` jitters retries (default: the
   * link's generator; without either, no jitter). */
  constructor(settings: Settings = makeSettings(), link: Link | null = null, rng: Random | null = null) {
    this.settings = settings;
    this.reloadPace = new Pacer(settings.reloadRate);
    this.shardOfChannel = new Map(allChannels(settings.channelNamespace, settings.shards).map((name, shard) => [name, shard]));
    this.rng = rng ?? link?.rng ?? NO_JITTER;
    this.remote = link === null ? null : new Remote(new PortForRemote(this), link, this.rng);
  }

  /** Run without the WebSocket from now on (the public-API mode: Polar serves no
   * /v1/outpost/): reads wait for a state hash anchored by the driver instead. */
  dropLink(): void {
    if (this.remote !== null) {
      this.remote.close();
      this.remote = null;
    }
  }

  // -- driver plumbing ------------------------------------------------------------------------

  /** A script of this instance that writes customers' state (track, an admission) is on its
   * way: its ticket, for the ScriptReplied or ScriptFailed that ends it (every ticket must end:
   * until then, changes nobody expects wait). Meanwhile a change published that nobody expects is
   * held, as it may be this script's echo come before its reply. Tickets count from 0, so a
   * replayed trace gets the same ones. */
  scriptSent(): number {
    return this.echoes.sent();
  }

  /** Whether a change published now would be held (scripts of this instance are in flight). */
  get holding(): boolean {
    return this.echoes.holding;
  }

  /** Whether data (a message from a shard channel, as it came) is the echo of this instance's own
   * change, already applied from its reply: forgotten if so. The driver asks it before it parses
   * anything. Not an input: it changes nothing the session answers, so a trace leaves it out. */
  ownEcho(data: unknown): boolean {
    return this.echoes.seen(data);
  }

  /** Take one input. Then drain effects() and run them. */
  handle(event: Input): void {
    const remote = this.remote;
    switch (event.kind) {
      case "ScriptReplied":
        if (event.ticket === undefined || event.ticket === null) {
          this.echoes.expect(event.reply);
          this.changes(event.reply);
        } else {
          // What was held for it came before its reply, so goes first; the echo it holds is its
          // own, dropped unparsed.
          for (const data of this.echoes.replied(event.ticket, event.reply)) this.changes(data);
          if (event.reply !== null) this.changes(event.reply); // null: it wrote nothing
        }
        if (event.tag !== null && remote !== null) remote.applied(event.tag);
        break;
      case "ChangePublished":
        if (!this.echoes.hold(event.data)) this.changes(event.data);
        break;
      case "BytesReceived":
      case "ConnectionOpened":
      case "ConnectionFailed":
        if (remote === null) throw new UsageError(`${event.kind} but this session has no link`);
        if (event.kind === "BytesReceived") {
          const refused = remote.link.refused;
          const connections = remote.link.connections;
          remote.received(event.data, event.now);
          if (remote.link.refused !== null && remote.link.refused !== refused) {
            // A refused token is the merchant's to fix: say it loudly, once per cause (the
            // refusal is one sentence that names its cause).
            // A 404 is Polar serving only its public API: the driver's mode "auto" takes it.
            this.lines.add(remote.link.refusedStatus === 404 ? "info" : "error", `outpost: ${remote.link.refused}`);
          }
          if (remote.link.connections > connections) this.lines.relay(this.polarOutage.succeeded(event.now));
        } else if (event.kind === "ConnectionOpened") remote.opened(event.now);
        else {
          remote.failed(event.now, event.reason);
          // Polar unreachable: one warning, a reminder a minute, one info line when it is back
          // (the reconnection's backoff is the link's; this only decides the log).
          this.lines.relay(this.polarOutage.failed(event.now, event.reason, 0)[1]);
        }
        break;
      case "PendingListed":
        remote?.listed(event.tag, event.fields);
        break;
      case "ListFailed":
        remote?.listFailed(event.tag);
        break;
      case "ScriptFailed":
        if (event.ticket !== undefined && event.ticket !== null) {
          for (const data of this.echoes.replied(event.ticket, null)) this.changes(data);
        }
        if (event.tag !== null) remote?.applyFailed(event.tag);
        break;
      case "IdentityLoaded":
        this.loaded(event.key, event.fields, event.loadId);
        break;
      case "LoadFailed":
        this.loadFailed(event.key, event.loadId);
        break;
      case "SubscriptionConfirmed":
        // Redis confirms a subscription to N channels one channel at a time (1, 2, ... N). A
        // first confirmation while subscribed is a client re-subscribing by itself after a break.
        if (event.count === 1 && this.subscribed) this.subscriptionLost();
        if (event.count === this.settings.shards) this.subscriptionRestarted();
        break;
      case "SubscriberRestarted":
        this.subscriptionRestarted();
        break;
      case "SubscriberLost":
        this.subscriptionLost();
        break;
      case "ChannelSubscribed":
        this.shardsConfirmed(this.shardsOf([event.channel]));
        break;
      case "ChannelsLost":
        this.shardsLost(this.shardsOf(event.channels));
        break;
      case "ConfigurationReceived":
        this.configureFrom(event.payload, event.fromCache);
        break;
      case "Closing":
        remote?.close();
        break;
      case "Tick":
        this.tick(event.now, event.wallUs);
        break;
      default:
        throw new UsageError(`not an input: ${repr(event)}`);
    }
  }

  private subscriptionRestarted(): void {
    this.shardsConfirmed(new Set(this.shardOfChannel.values()));
  }

  private subscriptionLost(): void {
    this.shardsLost(new Set(this.shardOfChannel.values()));
  }

  /** Messages of these shards may have been missed until now: their copies reload (and follow
   * from that load on); the other shards' copies are left alone. */
  private shardsConfirmed(shards: Set<number>): void {
    for (const shard of shards) this.liveShards.add(shard);
    if (this.liveShards.size === this.settings.shards) this.subscribed = this.everSubscribed = true;
    for (const mirror of this.mirrors.values()) {
      if (!shards.has(this.shardOf(mirror.customer))) continue;
      this.invalidate(mirror);
      if (mirror.loaded) mirror.stopFollowing();
      else this.load(mirror); // a load asked before the confirmation must not make it follow
    }
    // The copies of customers read recently reload at the reload pace, most recent first; the
    // others when next read (that read goes to Redis and starts the reload).
    this.reloads = [];
    for (const customer of this.following.recent(this.now - this.settings.recentWindow)) {
      if (!shards.has(this.shardOf(customer))) continue;
      for (const m of this.customerMirrors.get(customer.tag) as Mirror[]) this.reloads.push(m.key);
    }
    this.reloads.reverse(); // (popped from the end)
    this.paceReloads();
  }

  /** Reload what the pace allows of the queued copies that still need it. */
  private paceReloads(): void {
    let granted = this.reloadPace.take(this.now, this.reloads.length);
    while (granted > 0 && this.reloads.length) {
      const mirror = this.mirrors.get(this.reloads.pop() as string);
      if (mirror !== undefined && this.stale(mirror)) {
        this.load(mirror);
        granted -= 1;
      }
    }
  }

  /** Whether a copy must reload to follow Redis again (and now can). */
  private stale(mirror: Mirror): boolean {
    return mirror.loaded && !mirror.following && this.liveShards.has(this.shardOf(mirror.customer));
  }

  private shardsLost(shards: Set<number>): void {
    // Keep the copies (reads go to Redis meanwhile); they reload once subscribed again.
    for (const shard of shards) this.liveShards.delete(shard);
    if (shards.size) this.subscribed = false;
    for (const mirror of this.mirrors.values()) {
      if (!shards.has(this.shardOf(mirror.customer))) continue;
      mirror.stopFollowing();
      this.invalidate(mirror);
    }
  }

  /** The shards these channels belong to; a channel that is none of ours is rejected. */
  private shardsOf(channels: unknown[]): Set<number> {
    const shards = new Set<number>();
    for (const name of channels) {
      const shard = this.shardOfChannel.get(textOf(name) ?? "");
      if (shard === undefined) this.reject("subscription", `not one of the shard channels: ${repr(name)}`);
      else shards.add(shard);
    }
    return shards;
  }

  /** Drain what the driver must do now, in order. */
  effects(): Effect[] {
    const out = this.outbox;
    this.outbox = [];
    return out;
  }

  /** Drain what the driver must log, oldest first: at most the newest thousand lines, after one
   * that counts those let go when nobody drained them in time. */
  reports(): Report[] {
    return this.lines.drain();
  }

  /** Drain what happened that telemetry may record (no action needed). */
  observations(): Observation[] {
    const out = this.observed;
    this.observed = [];
    return out;
  }

  /** The earliest monotonic time at which a Tick has work to do. */
  nextDeadline(): number | null {
    const deadlines: number[] = [];
    const retry = this.retryAt.next();
    if (retry !== null) deadlines.push(retry);
    if (this.holdDue.size) deadlines.push(this.now + (Math.min(...this.holdDue.values()) - this.wallUs) / 1e6);
    const remote = this.remote?.nextDeadline() ?? null;
    if (remote !== null) deadlines.push(remote);
    const oldest = this.following.oldest();
    if (oldest !== null) deadlines.push(oldest[2] + this.settings.idleCustomerTtl);
    if (this.reloads.length) deadlines.push(this.reloadPace.nextAt(this.now));
    return deadlines.length ? Math.min(...deadlines) : null;
  }

  /** The WebSocket's state and the reason it last failed or was refused ("none" without an
   * access token). */
  linkStatus(): [string, string | null] {
    if (this.remote === null) return ["none", null];
    const link = this.remote.link;
    return [link.state, link.refused ?? link.lastError];
  }

  /** Whether the WebSocket to Polar is open. */
  get connected(): boolean {
    return this.remote !== null && this.remote.link.state === LinkState.OPEN;
  }

  // -- asked by the driver, and by Polar's side through its port ------------------------------

  knownRev(key: string): number {
    const mirror = this.mirrors.get(key);
    return mirror !== undefined && mirror.loaded ? mirror.rev : -1;
  }

  reject(kind: string, detail: string): void {
    this.rejections.set(kind, (this.rejections.get(kind) ?? 0) + 1);
    this.lines.add("warning", `outpost rejected ${kind}: ${detail}`);
  }

  get channelNamespace(): string {
    return this.settings.channelNamespace;
  }

  get shards(): number {
    return this.settings.shards;
  }

  /** The customer's shard in this deployment. */
  shardOf(customer: Customer): number {
    return shardOf(customer, this.settings.shards);
  }

  // -- for Polar's side only (PortForRemote) --------------------------------------------------

  private emit(effect: Effect): void {
    this.outbox.push(effect);
  }

  private observe(observation: Observation): void {
    this.observed.push(observation);
  }

  /** The customers read within recentWindow, most recent first. */
  private recentlyRead(): Customer[] {
    return this.following.recent(this.now - this.settings.recentWindow);
  }

  /** Polar names other reference forms for customer: its cached balances are stale, and every
   * reducer read of it follows the aliases' copies too (loads start now). */
  private aliasesChanged(customer: Customer, aliases: readonly Customer[]): void {
    for (const mirror of this.customerMirrors.get(customer.tag) ?? []) {
      this.invalidate(mirror);
      for (const alias of aliases) this.follow(alias, mirror.reducerId);
    }
  }

  /** The customer's events that no snapshot counted yet, as this instance's loaded copies read
   * them: [delivered to Polar, not yet delivered]. */
  private unsettled(customer: Customer): [number, number] {
    let delivered = 0;
    let undelivered = 0;
    for (const mirror of this.customerMirrors.get(customer.tag) ?? []) {
      if (!mirror.loaded) continue;
      const state = mirror.state;
      delivered += Math.max(state.pending - state.undelivered, 0);
      undelivered += Math.min(state.undelivered, state.pending);
    }
    return [delivered, undelivered];
  }

  /** Per meter of the reducer: the consumption this instance reads now (empty if unknown). */
  private consumed(customer: Customer, reducerId: string): Map<string, number> {
    const mirror = this.mirrors.get(stateKey(customer, reducerId, this.settings.shards));
    const reducer = this.configuration?.reducers.get(reducerId);
    if (mirror === undefined || !mirror.loaded || reducer === undefined) return new Map();
    if (!reducer.aggregation.bucketed()) return new Map();
    const state = mirror.state;
    const quantity = state.polar.merge(state.local).quantity(reducer.aggregation.func);
    return new Map(reducer.meterIds.map((m) => [m, quantity]));
  }

  // -- configuration --------------------------------------------------------------------------

  private configureFrom(payload: unknown, fromCache: boolean): void {
    let configuration: Configuration;
    let text: string;
    try {
      if (typeof payload === "string" || payload instanceof Uint8Array) {
        // The cached text, as Redis holds it (the Python driver hands it over unparsed).
        const raw = typeof payload === "string" ? payload : new TextDecoder("utf-8", { fatal: true }).decode(payload);
        try {
          payload = JSON.parse(raw);
        } catch {
          throw new TypeError("not JSON");
        }
      }
      configuration = parseConfiguration(payload);
      text = JSON.stringify(payload);
    } catch (exc) {
      if (!(exc instanceof InvalidDefinition || exc instanceof TypeError)) throw exc;
      this.reject("configuration", `unusable configuration: ${exc.message}`);
      return;
    }
    for (const problem of configuration.problems) this.reject("configuration", problem);
    if (text === this.configurationText) {
      if (!fromCache) this.configurationFromPolar = true; // Polar confirmed the cached one
      return;
    }
    if (fromCache && this.configurationFromPolar) return; // what Polar sent beats any cache
    this.configuration = configuration;
    this.configurationText = text;
    this.configurationFromPolar = !fromCache;
    this.balances.clear();
    if (!fromCache) this.outbox.push({ kind: "StoreConfiguration", key: CONFIGURATION_KEY, text });
  }

  // -- writes ---------------------------------------------------------------------------------

  /** Validate an event and return the script that tracks it. Throws InvalidEvent for input Polar
   * would refuse, NotReady when no configuration has arrived yet. The driver runs the script,
   * then hands the reply to handle() as ScriptReplied. */
  track(args: TrackArgs): RunScript {
    const customer = customerOf(args.externalCustomerId, args.customerId);
    const { timestampUs, nowUs, eventId } = args;
    if (!Number.isSafeInteger(timestampUs)) throw new UsageError("timestamp_us must be an integer number of microseconds");
    if (timestampUs > nowUs) throw new InvalidEvent("timestamp is in the future; Polar refuses such events");
    if (timestampUs < 0) {
      // A negative bucket makes events-hash fields ("-3:id") the Lua scripts cannot parse.
      throw new InvalidEvent("timestamp is before 1970; outpost cannot bucket such events");
    }
    const event = buildEvent({ eventId, name: args.name, customer, metadata: args.metadata, timestampUs });
    if (this.configuration === null) {
      throw new NotReady("no configuration from Polar yet: cannot tell which meters count it");
    }
    const bucket = floorBucket(timestampUs);
    const shard = this.shardOf(customer);
    const keys = [outboxKey(shard)];
    const values: string[] = [];
    const states: string[] = [];
    const meterIds: string[] = [];
    const reducers = this.configuration.reducers;
    for (const [reducerId, value] of this.configuration.contributions(event.view())) {
      if (Math.abs(value) > MAX_VALUE) {
        throw new InvalidEvent(
          `${reducerId} counts a value of ${reprFloat(value)}; outpost refuses values beyond ` +
            "±1e+300 (a bucket's sum of them would overflow)",
        );
      }
      meterIds.push(...(reducers.get(reducerId) as Reducer).meterIds);
      const state = stateKey(customer, reducerId, this.settings.shards);
      keys.push(state, bucketKey(state, bucket));
      values.push(String(this.knownRev(state)), formatNumber(value));
      states.push(state);
    }
    const scriptArgs = [
      channel(shard, this.settings.channelNamespace),
      `${bucket}:${eventId}`,
      String(bucket),
      JSON.stringify(event.ingestItem()),
      JSON.stringify(states),
      ...values,
    ];
    return runScript("track", keys, scriptArgs, null, meterIds, states.length);
  }

  // -- reads ----------------------------------------------------------------------------------

  /** The warm path: a balance computed since the last change, or null. */
  cachedBalance(meterId: string, externalCustomerId: string | null, customerId: string | null): Balance | null {
    const key = readKey(meterId, externalCustomerId, customerId);
    const balance = this.balances.get(key);
    if (balance === undefined) return null;
    this.warmRead.add(key);
    return balance;
  }

  /** The balance from memory; a Fetch when it must come from Redis instead; or null while the
   * customer's state is not ready. null also starts what makes it ready (a load, a snapshot
   * request); wait for a change and ask again. A copy answers from memory only while it follows
   * Redis (see mirror.ts); otherwise, and always when fresh, the answer is a Fetch: the driver
   * reads the hashes and hands them to readFetched(). Before the subscription was ever confirmed,
   * a read waits for it (null) rather than fetch, unless fresh. Throws UnknownMeter,
   * UnsupportedMeter or InvalidEvent (a bad customer argument) at once. */
  read(meterId: string, externalCustomerId: string | null = null, customerId: string | null = null, fresh = false): Balance | Fetch | null {
    if (typeof meterId !== "string" || !meterId) {
      throw new UsageError(`meter_id must be a non-empty string, got ${repr(meterId)}`);
    }
    const customer = customerOf(externalCustomerId, customerId);
    const reducer = this.reducer(meterId, true);
    if (reducer === null) return null;
    const mirror = this.follow(customer, reducer.id);
    // The customer's other names: their pending events count too (docs/invariant.md).
    const aliases = this.aliasesOf(customer);
    const others = aliases.length ? aliases.map((alias) => this.follow(alias, reducer.id)) : NONE;
    const following = this.following;
    following.touch(customer.tag);
    for (const alias of aliases) following.touch(alias.tag);
    if (following.size > this.settings.maxCustomers) {
      this.letGoBeyond(this.settings.maxCustomers, [customer, ...aliases]);
    }
    if (!mirror.loaded || !others.every((m) => m.loaded)) return this.waiting(customer);
    if (mirror.state.coldUntil === null) {
      this.remote?.lost(customer); // e.g. its keys expired: ask Polar again
      return this.waiting(customer);
    }
    if (this.remote !== null) {
      const flow = this.remote.follow(customer);
      // A customer read again after this process let it go answers from Redis at once: the
      // process kept its other names (docs/invariant.md); a fresh snapshot is asked.
      if (!flow.applied && !flow.rejoined) return this.waiting(customer);
    }
    if (fresh || !mirror.following || !others.every((m) => m.following)) {
      if (!fresh && !this.everSubscribed) return this.waiting(customer); // waits for the subscription
      for (const m of [mirror, ...others]) {
        if (this.stale(m)) this.load(m); // its restarted shard missed changes: follow Redis again
      }
      following.waiting(customer.tag, this.settings.loadTimeout);
      return { kind: "Fetch", keys: [mirror.key, ...others.map((m) => m.key)] };
    }
    following.answered(customer.tag);
    const key = readKey(meterId, externalCustomerId ?? null, customerId ?? null);
    let state = mirror.state;
    if (others.length) {
      state = mergedState(state, others.map((m) => m.state));
      for (const m of others) m.readKeys.add(key); // a change of any of them makes it stale
    }
    const balance = computeBalance(meterId, customer, reducer.aggregation.func, state, aliases, this.wallUs);
    const expiry = state.holds.length ? holdExpiry(state, this.wallUs) : null;
    if (expiry !== null) {
      for (const m of [mirror, ...others]) this.holdDue.set(m.key, Math.min(expiry, this.holdDue.get(m.key) ?? expiry));
    }
    this.balances.set(key, balance);
    mirror.readKeys.add(key);
    return balance;
  }

  /** The read waits for its customer's state: not let go meanwhile. */
  private waiting(customer: Customer): null {
    this.following.waiting(customer.tag, this.settings.snapshotTimeout + 1.0);
    return null;
  }

  /** The balance from the hashes a Fetch read (source "redis"): fields maps each of its keys to
   * that hash's fields. null when the customer's hash holds no snapshot (it expired or was wiped:
   * Polar is asked again), or when the customer's aliases changed since the Fetch (a hash is
   * missing: read again). Each copy takes its hash too when it is newer. */
  readFetched(
    meterId: string,
    externalCustomerId: string | null,
    customerId: string | null,
    fields: ReadonlyMap<string, RawFields> | Record<string, RawFields>,
  ): Balance | null {
    const customer = customerOf(externalCustomerId, customerId);
    const reducer = this.reducer(meterId, false) as Reducer; // read() returned a Fetch
    const aliases = this.aliasesOf(customer);
    const keys = [customer, ...aliases].map((c) => stateKey(c, reducer.id, this.settings.shards));
    const byKey = fields instanceof Map ? fields : new Map(Object.entries(fields));
    if (!byKey.has(keys[0] as string)) throw new UsageError(`read_fetched needs the fields of ${keys[0] as string}`);
    if (!keys.every((key) => byKey.has(key))) return null;
    const states = keys.map((key) => this.fetchedState(key, byKey.get(key) as RawFields));
    const [own, ...rest] = states as [ReturnType<typeof deriveState>, ...ReturnType<typeof deriveState>[]];
    if (own.coldUntil === null) {
      this.remote?.lost(customer);
      return null;
    }
    return computeBalance(meterId, customer, reducer.aggregation.func, mergedState(own, rest), aliases, this.wallUs).fromRedis();
  }

  /** Why read() returns null, for the NotReady message. Throws UnknownMeter when the meter is
   * still missing from the configuration. */
  notReadyReason(meterId: string, externalCustomerId: string | null, customerId: string | null): string {
    const [state, error] = this.linkStatus();
    if (error && this.reducer(meterId, true) === null && this.configuration !== null) {
      // Only the cache is here, without the meter, and Polar's cannot come: the meter may well
      // exist, and what stands in the way is the WebSocket's error (a refused token).
      return (
        `meter ${reprString(meterId)} is not in the configuration cached in Redis and Polar's ` +
        `has not arrived (WebSocket ${state}: ${error})`
      );
    }
    const reducer = this.reducer(meterId, false);
    if (reducer === null) {
      return `no configuration from Polar yet (WebSocket ${state}${error ? `: ${error}` : ""})`;
    }
    const customer = customerOf(externalCustomerId, customerId);
    for (const name of [customer, ...this.aliasesOf(customer)]) {
      const mirror = this.mirrors.get(stateKey(name, reducer.id, this.settings.shards));
      if (mirror === undefined || !mirror.loaded) {
        const alias = name.tag === customer.tag ? "" : ` (another name of ${customer})`;
        return `the local state of ${name}${alias} could not be loaded from Redis`;
      }
    }
    const mirror = this.mirrors.get(stateKey(customer, reducer.id, this.settings.shards)) as Mirror;
    const hasSnapshot = mirror.state.coldUntil !== null;
    const applied = this.remote === null || this.remote.follow(customer).applied;
    if (hasSnapshot && applied && !this.everSubscribed) {
      return "Redis has not confirmed the subscription to the change channels yet";
    }
    if (this.remote === null) return `no snapshot for ${customer} in Redis yet (this instance has no access token)`;
    const link = this.remote.link;
    let status: string = link.state;
    if (link.state !== LinkState.OPEN && link.lastError) status += `: ${link.lastError}`;
    return `no snapshot from Polar for ${customer} yet (WebSocket ${status})`;
  }

  private reducer(meterId: string, waiting: boolean): Reducer | null {
    if (this.configuration === null) return null;
    const reducer = this.configuration.reducerFor(meterId);
    if (reducer === null) {
      if (waiting && this.remote !== null && !this.configurationFromPolar) {
        return null; // the cached configuration may predate the meter: wait for Polar's
      }
      throw new UnknownMeter(`meter ${reprString(meterId)} is not in Polar's configuration`);
    }
    if (!reducer.aggregation.bucketed()) {
      throw new UnsupportedMeter(
        `meter ${reprString(meterId)} aggregates with ${reprString(reducer.aggregation.func)}, which cannot ` +
          "be reduced into buckets; read it from Polar's API instead",
      );
    }
    return reducer;
  }

  private follow(customer: Customer, reducerId: string): Mirror {
    const key = stateKey(customer, reducerId, this.settings.shards);
    let mirror = this.mirrors.get(key);
    if (mirror === undefined) {
      mirror = new Mirror(key, customer, reducerId);
      this.mirrors.set(key, mirror);
      const mine = this.customerMirrors.get(customer.tag) ?? [];
      mine.push(mirror);
      this.customerMirrors.set(customer.tag, mine);
      this.load(mirror);
      if (mine.length === 1) this.startFollowing(customer);
    }
    return mirror;
  }

  private startFollowing(customer: Customer): void {
    this.following.add(customer.tag, customer, this.now);
    if (this.remote !== null) {
      const aliases = this.letGo.get(customer.tag);
      this.letGo.delete(customer.tag);
      if (aliases !== undefined && aliases.length) this.remote.aliases.set(customer.tag, aliases);
      this.remote.follow(customer).rejoined = aliases !== undefined;
    }
  }

  /** Let go of the least recently read customers until at most limit are followed, and of those
   * not read for idleCustomerTtl. A customer whose read waits for its answer is kept, and one
   * whose cached balances were read warm since last looked at counts as read now. */
  private letGoBeyond(limit: number, keep: readonly Customer[] = []): void {
    const following = this.following;
    const now = this.now;
    const idleBefore = now - this.settings.idleCustomerTtl;
    for (let turns = following.size; turns > 0; turns--) {
      const [tag, customer, last] = following.oldest() as [string, Customer, number];
      if (following.size <= limit && last > idleBefore) return;
      let warm = false;
      for (const mirror of this.customerMirrors.get(tag) as Mirror[]) {
        for (const key of mirror.readKeys) warm = this.warmRead.delete(key) || warm;
      }
      if (warm || keep.some((c) => c.tag === tag) || following.pinned(tag, now)) {
        following.touch(tag);
        following.stamp(now); // (the touched ones all date from now: order holds)
        continue;
      }
      this.letGoOf(customer);
    }
  }

  /** Drop the customer's copies, cached balances and flow; tell Polar to forget it. The shard
   * channels stay: other customers share them. */
  private letGoOf(customer: Customer): void {
    this.lines.add("debug", `outpost lets go of ${customer}`);
    for (const mirror of this.customerMirrors.get(customer.tag) as Mirror[]) {
      for (const key of mirror.readKeys) this.warmRead.delete(key);
      this.invalidate(mirror);
      this.mirrors.delete(mirror.key);
      this.retryAt.cancel(mirror.key);
      this.loadFailures.delete(mirror.key);
    }
    this.customerMirrors.delete(customer.tag);
    this.following.drop(customer.tag);
    if (this.remote !== null) {
      this.letGo.set(customer.tag, this.remote.forget(customer));
      if (this.letGo.size > this.settings.maxCustomers) this.letGo.delete(this.letGo.keys().next().value as string);
    }
  }

  /** The customer's other names Polar told this instance (none without a link). */
  private aliasesOf(customer: Customer): readonly Customer[] {
    return this.remote?.aliases.get(customer.tag) ?? NONE_CUSTOMERS;
  }

  /** The identities this instance keeps a copy of (for inspection). */
  get followed(): Mirror[] {
    return [...this.mirrors.values()];
  }

  // -- keeping copies current -----------------------------------------------------------------

  private load(mirror: Mirror): void {
    const loadId = mirror.startLoad(this.liveShards.has(this.shardOf(mirror.customer)));
    this.lines.add("debug", `outpost loads ${mirror.key} (copy at revision ${mirror.rev})`);
    // Asked again if no answer comes (a driver task cancelled mid-load loses it).
    this.retryAt.set(mirror.key, this.now + this.settings.loadTimeout);
    this.outbox.push({ kind: "LoadIdentity", key: mirror.key, loadId });
  }

  private loadFailed(key: string, loadId: number): void {
    const mirror = this.mirrors.get(key);
    if (mirror === undefined || loadId !== mirror.loadId) return;
    this.loadFailures.set(key, (this.loadFailures.get(key) ?? 0) + 1);
    this.loadFailedLater(key);
  }

  /** Ask for the load again after the backoff its failures in a row call for. */
  private loadFailedLater(key: string): void {
    const s = this.settings;
    const delay = backoff(this.loadFailures.get(key) as number, s.reloadRetry, s.reloadCap, this.rng.random());
    this.retryAt.set(key, this.now + delay);
  }

  /** The hash's fields as text; a field that is not UTF-8 text is left out, and counted (or,
   * with refused, named there for the caller to count). */
  private textFields(key: string, fields: RawFields, refused?: string[]): Map<string, string> {
    const text = new Map<string, string>();
    const entries = fields instanceof Map ? [...fields.entries()] : Object.entries(fields);
    for (const [name, value] of entries) {
      const nameS = textOf(name);
      const valueS = textOf(value);
      if (nameS === null || valueS === null) {
        if (refused === undefined) this.reject("state", `${key}: field that is not UTF-8 text`);
        else refused.push(`${repr(name)}: ${repr(value)}`);
        continue;
      }
      text.set(nameS, valueS);
    }
    return text;
  }

  /** The state of a hash a fresh read fetched; a copy takes it too when it is newer. */
  private fetchedState(key: string, raw: RawFields): IdentityState {
    const names: string[] = [];
    const text = this.textFields(key, raw, names);
    const refused = names.sort().join("\n");
    const mirror = this.mirrors.get(key);
    const last = mirror?.fetched ?? null;
    // The same fields fetched again: the same state, and a field refused counted once, not at
    // every fresh read (a log flood).
    if (last !== null && last.refused === refused && sameFields(last.text, text)) {
      return this.fetchedNewer(mirror as Mirror, last.state, text);
    }
    for (let i = 0; i < names.length; i++) this.reject("state", `${key}: field that is not UTF-8 text`);
    const state = deriveState(text);
    if (mirror === undefined) return state;
    mirror.fetched = { text, refused, state };
    return this.fetchedNewer(mirror, state, text);
  }

  /** A fetched state; the copy takes it too when it is newer. */
  private fetchedNewer(mirror: Mirror, state: IdentityState, text: ReadonlyMap<string, string>): IdentityState {
    // An offer of the copy's own revision or an older one changes nothing.
    if (mirror.loaded && state.revision > Math.max(mirror.rev, 0)) {
      mirror.offer({ key: mirror.key, rev: state.revision, set: [...text.entries()], deleted: [], full: true });
      this.invalidate(mirror);
    }
    return state;
  }

  private changes(raw: unknown): void {
    let changes;
    try {
      changes = parseChanges(raw, (key) => this.mirrors.has(key));
    } catch (exc) {
      if (!(exc instanceof Malformed)) throw exc;
      this.reject("change", `unreadable change from Redis: ${exc.message}`);
      return;
    }
    for (const change of changes ?? []) {
      const mirror = this.mirrors.get(change.key) as Mirror; // only those of followed keys
      const unreadable = change.set?.length ? unreadableFields(change.set) : [];
      if (unreadable.length) {
        this.refuseChange(mirror, change, unreadable);
        continue;
      }
      const outcome = mirror.offer(change);
      // Applied, or waiting behind a load: either way the cached balance is stale.
      if (outcome !== Offer.IGNORED) this.invalidate(mirror);
      if (outcome === Offer.GAP) this.load(mirror);
    }
  }

  /** A change holding a value the scripts never write: a peer published it, or the hash holds
   * it. Either way the hash decides: the copy reloads it when the change is newer (a load counts
   * what the hash holds), rather than take what a read could not use. */
  private refuseChange(mirror: Mirror, change: Change, unreadable: readonly string[]): void {
    const detail = `${change.key} at revision ${change.rev}: unreadable field ${unreadable.join(", ")}`;
    this.reject("change", `unreadable change from Redis: ${detail}`);
    if (change.rev > mirror.rev) {
      this.load(mirror);
      this.invalidate(mirror);
    }
  }

  private loaded(key: string, fields: RawFields, loadId: number): void {
    const mirror = this.mirrors.get(key);
    if (mirror === undefined) return;
    if (loadId !== mirror.loadId) {
      this.lines.add("debug", `outpost ignores load ${loadId} of ${key} (load ${mirror.loadId} is newer)`);
      return;
    }
    const text = this.textFields(key, fields);
    this.lines.add("debug", `outpost loaded ${key} at revision ${text.get("rev") ?? "None"}`);
    this.retryAt.cancel(key);
    const complete = mirror.loadedWith(text, loadId);
    if (complete === false) {
      // A gap the load did not close (a held change of an incarnation of the hash that is gone):
      // load again at once the first time, then back off, not spin on Redis.
      const failures = (this.loadFailures.get(key) ?? 0) + 1;
      this.loadFailures.set(key, failures);
      if (failures === 1) this.load(mirror);
      else this.loadFailedLater(key);
    } else {
      this.loadFailures.delete(key);
    }
    for (const problem of mirror.state.problems) this.reject("state", `${key}: unreadable field ${problem}`);
    this.invalidate(mirror);
  }

  private invalidate(mirror: Mirror): void {
    for (const key of mirror.readKeys) this.balances.delete(key);
    mirror.readKeys.clear();
  }

  private tick(now: number, wallUs: number): void {
    this.now = now;
    this.following.stamp(now);
    this.wallUs = wallUs;
    for (const [key, expires] of [...this.holdDue]) {
      if (expires > wallUs) continue; // a hold expired: the balances that counted it are stale
      this.holdDue.delete(key);
      const mirror = this.mirrors.get(key);
      if (mirror !== undefined) this.invalidate(mirror); // not let go meanwhile
    }
    if (this.remote !== null) {
      this.remote.wallUs = wallUs;
      this.remote.tick(now);
    }
    // (An answered load or a let-go copy cancels its deadline.)
    for (const key of this.retryAt.popDue(now)) this.load(this.mirrors.get(key) as Mirror);
    if (this.reloads.length) this.paceReloads();
    this.letGoBeyond(this.settings.maxCustomers);
  }
}

/** What Polar's side of a session may do to it and ask of it (remote.ts Host), and no more: the
 * session's other public members are its driver's. What only this port uses is private to
 * Session, reached by bracket access (which TypeScript still type-checks). Exported for the
 * core's tests, not from index.ts. */
export class PortForRemote implements Host {
  constructor(private readonly session: Session) {}

  emit(effect: Effect): void {
    this.session["emit"](effect);
  }

  configure(payload: unknown): void {
    this.session["configureFrom"](payload, false);
  }

  knownRev(key: string): number {
    return this.session.knownRev(key);
  }

  reject(kind: string, detail: string): void {
    this.session.reject(kind, detail);
  }

  observe(observation: Observation): void {
    this.session["observe"](observation);
  }

  consumed(customer: Customer, reducerId: string): Map<string, number> {
    return this.session["consumed"](customer, reducerId);
  }

  aliasesChanged(customer: Customer, aliases: readonly Customer[]): void {
    this.session["aliasesChanged"](customer, aliases);
  }

  recentlyRead(): Customer[] {
    return this.session["recentlyRead"]();
  }

  unsettled(customer: Customer): [number, number] {
    return this.session["unsettled"](customer);
  }

  get refreshAfter(): number | null {
    return this.session.settings.refreshAfter;
  }

  get reloadRate(): number {
    return this.session.settings.reloadRate;
  }

  get pendingLimitUs(): number {
    return this.session.settings.pendingLimitUs;
  }

  get channelNamespace(): string {
    return this.session.channelNamespace;
  }

  get shards(): number {
    return this.session.shards;
  }

  shardOf(customer: Customer): number {
    return this.session.shardOf(customer);
  }
}

/** No alias copies (never mutated: the common case builds no list). */
const NONE: Mirror[] = [];
const NONE_CUSTOMERS: readonly Customer[] = [];

/** The draw of a session with neither a generator nor a link: the middle of the range. */
const NO_JITTER: Random = { random: () => 0.5 };

function sameFields(a: ReadonlyMap<string, string>, b: ReadonlyMap<string, string>): boolean {
  if (a.size !== b.size) return false;
  for (const [name, value] of a) if (b.get(name) !== value) return false;
  return true;
}
