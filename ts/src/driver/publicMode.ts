/** The public-API mode: Polar followed through its public API (docs/public-mode.md), as the
 * Python drivers do (outpost_async/_public.py, _anchors.py).
 *
 * Where Polar serves no /v1/outpost/, there is no WebSocket and no snapshot. Instead:
 * - the configuration comes from GET /v1/meters/ (one reducer per meter, cached in Redis marked
 *   with the mode), refreshed every pollInterval;
 * - a first read of a customer asks for its figures at once (wanted()) and waits for the anchor
 *   as a first read waits for a snapshot;
 * - one poll loop per instance plans (the core's PollPlanner) which customer meters to ask
 *   GET /v1/customer-meters/ about, and which to probe (GET /v1/meters/{id}/quantities: a
 *   balance at or below the band, or a busy ledger under an old figure), each request taken from
 *   the budget every instance shares (budget.lua), and applies the answers;
 * - webhooks (handleWebhook) apply the figures Polar pushes.
 *
 * Applying a figure to Redis, and verifying a webhook, is anchors.ts's.
 *
 * mode "auto" starts like the snapshot protocol and switches to this mode when Polar answers the
 * WebSocket's upgrade with a 404. */

import type { Cluster, Redis } from "ioredis";
import { type BudgetAnswered, take, waitOf } from "../core/budget.js";
import type { Effect } from "../core/effects.js";
import { ConfigurationError, RedisUnavailable } from "../core/errors.js";
import { customerOf } from "../core/event.js";
import { CONFIGURATION_KEY, Customer, type CustomerKind } from "../core/keys.js";
import { LinkState } from "../core/link.js";
import {
  type Meter,
  type Mode,
  type RunningMode,
  cachedMode,
  checkMode,
  chooseMode,
  customerOfReading,
  missingRows,
  modeConflict,
  noRow,
  parseMetersPage,
  publicConfiguration,
  urgentRequests,
} from "../core/publicAnchoring.js";
import { type CustomerMetersRequest, type Followed, KINDS, PollPlanner, type QuantitiesProbe, requestCustomers, requestKind, requestParams } from "../core/publicPolls.js";
import { followedOf, parseQuantities, probeAnchor, probeParams, quantitiesPath } from "../core/publicProbes.js";
import { MAX_BODY_BYTES, parseCustomerMeters } from "../core/publicReadings.js";
import type { Session } from "../core/session.js";
import { type Logger, logError } from "./logger.js";
import { secretKey } from "../core/webhookSignature.js";
import { redisUnavailable } from "./connections.js";
import { Anchors } from "./anchors.js";
import { readAtMost } from "./http.js";
import { Signal, monotonic } from "./signal.js";

const RETRY = 1.0; // seconds before a failed request to Polar is tried again
const POLL = 0.25; // seconds between two looks at whether auto found the mode
const PLAN_EVERY = 1.0; // seconds between two looks at what is due (each walks the followed copies)
/** Seconds a customer asked for at once is not asked again while its read still waits (the
 * answer is being applied). */
const ASKED_AGAIN = 2.0;

/** What the public mode needs of an Outpost instance. */
export interface PublicHooks {
  readonly core: Session;
  readonly redis: Redis | Cluster;
  readonly signal: Signal;
  readonly log: Logger;
  readonly serverUrl: string;
  readonly accessToken: string | null;
  readonly userAgent: string;
  readonly closing: AbortSignal;
  closed(): boolean;
  /** A script run; rejects with RedisUnavailable when Redis fails. */
  script(name: string, keys: string[], args: string[]): Promise<unknown>;
  run(effects: Effect[]): Promise<void>;
  /** What the core asks for now (what it reported meanwhile goes to the log). */
  drain(): Effect[];
  pause(seconds: number): Promise<void>;
  nowUs(): number;
}

export interface PublicOptions {
  mode: Mode;
  /** Seconds: how long before a figure's modified_at an acknowledged event may still be missing
   * from it. */
  margin: number;
  /** Seconds between two polls of a customer meter (and two reads of the meters). */
  pollInterval: number;
  webhookSecret: string | null;
  requestsPerMinute: number;
}

export type Headers = Record<string, string | string[] | undefined>;

/** The mode an instance runs, and the public mode's loop. */
export class PublicMode {
  readonly requested: Mode;
  mode: Mode;
  reason: string;
  readonly planner: PollPlanner;
  /** Applying figures to Redis, and webhooks. */
  readonly anchors: Anchors;
  /** Figures applied, by outcome (first, accepted, rejected, reset, stale, no_watermark; probes
   * probed, probe_rejected, probe_unused), and conflicts given up. */
  readonly outcomes: Map<string, number>;
  lastError: string | null = null;
  /** Requests sent to Polar's public API (meters, customer meters, quantities). */
  requests = 0;
  /** When the last request went out (Outpost's clock, µs). */
  private sentAtUs = 0;
  /** What the planner last learnt of each followed copy, by the copy's revision. */
  private views = new Map<string, [number, Followed]>();
  /** Customers a read waits for (by tag: external:<id> or customer:<id>), and when each was. */
  private readonly urgent = new Map<string, Customer>();
  private readonly askedAt = new Map<string, number>();
  private readonly wake = new Signal();
  private seen = new Map<string, number | null>();

  constructor(
    private readonly hooks: PublicHooks,
    private readonly options: PublicOptions,
  ) {
    this.requested = PublicMode.check(options);
    this.mode = this.requested;
    this.reason = this.requested === "auto" ? "waiting for Polar's answer on /v1/outpost/" : `mode=${JSON.stringify(this.requested)} was asked`;
    const key = options.webhookSecret ? secretKey(options.webhookSecret) : null; // throws if malformed
    this.anchors = new Anchors(hooks, Math.round(options.margin * 1_000_000), key);
    this.outcomes = this.anchors.outcomes;
    const share = options.requestsPerMinute > 0 ? options.requestsPerMinute / 2 : 300;
    this.planner = new PollPlanner({ perMinute: share, pollEveryS: options.pollInterval });
  }

  /** The options' mistakes, thrown at once (UsageError, ConfigurationError); the mode asked. */
  static check(options: PublicOptions): Mode {
    const mode = checkMode(options.mode);
    if (!(options.margin >= 0 && options.pollInterval > 0)) {
      throw new ConfigurationError("public_margin must be >= 0 and poll_interval > 0"); // Python's words
    }
    if (options.webhookSecret) secretKey(options.webhookSecret);
    return mode;
  }

  // -- the mode ---------------------------------------------------------------------------------

  /** A mode asked for: run without the WebSocket if public, and refuse a Redis whose cached
   * configuration was built by the other mode. */
  async beforeStart(): Promise<void> {
    if (this.requested === "auto") return;
    const conflict = modeConflict(this.requested, await this.cachedMode());
    if (conflict !== null) throw new ConfigurationError(conflict);
    if (this.requested === "public") this.hooks.core.dropLink();
  }

  private async cachedMode(): Promise<RunningMode | null> {
    let text: string | null;
    try {
      text = await this.hooks.redis.get(CONFIGURATION_KEY);
    } catch (exc) {
      throw redisUnavailable("reading the cached configuration", exc, this.hooks.redis);
    }
    return text === null ? null : cachedMode(text);
  }

  /** Auto: the link opened (the snapshot protocol) or was refused with a 404 (the public API)?
   * Whether the mode was just decided public (the caller drops the WebSocket's socket). */
  decide(): boolean {
    if (this.mode !== "auto") return false;
    const link = this.hooks.core.remote?.link ?? null;
    let status: number | null = null;
    if (link !== null && link.state === LinkState.OPEN) status = 101;
    else if (link !== null && link.refusedStatus !== null) status = link.refusedStatus;
    if (status === null) return false;
    [this.mode, this.reason] = chooseMode("auto", status, null);
    if (this.mode !== "public") return false;
    this.hooks.core.dropLink();
    this.wake.fire();
    return true;
  }

  // -- reads waiting for an anchor --------------------------------------------------------------

  /** A read waits for this customer's anchor: ask Polar at once (by the name the read gave: the
   * external id, or Polar's customer id). */
  wanted(externalCustomerId: string | null, customerId: string | null = null): void {
    if (this.mode === "snapshots") return;
    let customer: Customer;
    try {
      customer = customerOf(externalCustomerId ?? undefined, customerId ?? undefined);
    } catch {
      return; // (the read says so itself)
    }
    if (this.urgent.has(customer.tag)) return;
    const asked = this.askedAt.get(customer.tag);
    if (asked !== undefined && monotonic() - asked < ASKED_AGAIN) return;
    this.urgent.set(customer.tag, customer);
    this.wake.fire();
  }

  /** Why a read waits, in the public mode's words, from the core's `reason` (which speaks of
   * snapshots and the WebSocket); the core's own when it names something else. */
  notReadyReason(reason: string, customer: string): string {
    if (this.mode !== "public") return reason; // (auto: the WebSocket's state says why)
    const error = this.lastError ? ` (last error: ${this.lastError})` : "";
    if (reason.startsWith("no configuration from Polar yet")) return `no configuration from Polar's /v1/meters/ yet${error}`;
    if (!reason.startsWith("no snapshot for ")) return reason;
    return `Polar's customer meters of ${customer} not read yet${error}`;
  }

  // -- the loop ---------------------------------------------------------------------------------

  async run(): Promise<void> {
    const hooks = this.hooks;
    while (!hooks.closed() && this.mode === "auto") {
      const version = hooks.signal.version;
      this.decide();
      if (this.mode === "auto") await hooks.signal.wait(version, POLL);
    }
    if (this.mode === "public" && this.requested === "auto") {
      const conflict = modeConflict("public", await this.cachedMode().catch(() => null));
      if (conflict !== null) {
        logError(hooks.log, `outpost: ${conflict}`); // two modes on one Redis: an operator sets mode alike
        this.reason += `; ${conflict}`;
      }
    }
    if (this.mode !== "public" || !hooks.accessToken) return; // the snapshot protocol, or no token to ask Polar with
    let refreshAt = 0;
    while (!hooks.closed()) {
      const version = this.wake.version;
      try {
        if (monotonic() >= refreshAt) {
          const done = await this.configure();
          refreshAt = monotonic() + (done ? this.options.pollInterval : RETRY);
        }
        if (this.urgent.size) await this.pollUrgent();
        const [polls, probes] = this.plan();
        for (const request of polls) await this.poll(request, null);
        for (const probe of probes) await this.probe(probe);
      } catch (exc) {
        // The loop never dies: Redis failing is retried; anything else is a bug, said and retried.
        if (exc instanceof RedisUnavailable) this.failed(exc.message, "Redis");
        else logError(hooks.log, `outpost: the public mode's poll loop failed (retried): ${exc instanceof Error ? (exc.stack ?? exc.message) : String(exc)}`);
        await hooks.pause(RETRY);
      }
      await this.wake.wait(version, PLAN_EVERY); // a read waiting wakes it at once
    }
  }

  /** Read every page of GET /v1/meters/ and hand the session the configuration. */
  async configure(): Promise<boolean> {
    const meters: Meter[] = [];
    let page = 1;
    let maxPage = 1;
    while (page <= maxPage) {
      const body = await this.get("/v1/meters/", [["page", String(page)], ["limit", "100"]]);
      if (body === null) return false;
      const parsed = parseMetersPage(body);
      for (const problem of parsed.problems) this.hooks.core.reject("configuration", problem);
      meters.push(...parsed.meters);
      page += 1;
      maxPage = parsed.maxPage;
    }
    this.hooks.core.handle({ kind: "ConfigurationReceived", payload: publicConfiguration(meters), fromCache: false });
    await this.hooks.run(this.hooks.drain());
    return true;
  }

  /** Customer (named as `kind` names it) -> the meters this instance keeps a copy of. */
  private followedMeters(kind: CustomerKind): Map<string, string[]> {
    const out = new Map<string, string[]>();
    for (const mirror of this.hooks.core.followed) {
      if (mirror.customer.kind !== kind) continue;
      out.set(mirror.customer.id, [...(out.get(mirror.customer.id) ?? []), mirror.reducerId]);
    }
    return out;
  }

  /** What the planner says is due; what an instance (any) anchored counts as heard. */
  private plan(): [CustomerMetersRequest[], QuantitiesProbe[]] {
    const now = this.hooks.nowUs(); // Outpost's clock: a probe's window is on it
    const seen = new Map<string, number | null>();
    const configuration = this.hooks.core.configuration;
    const views = this.views;
    this.views = new Map();
    for (const mirror of this.hooks.core.followed) {
      if (this.urgent.has(mirror.customer.tag)) continue; // (asked for by the next turn, all meters at once)
      const [kind, customer, meterId] = [mirror.customer.kind, mirror.customer.id, mirror.reducerId];
      const key = JSON.stringify([kind, customer, meterId]);
      this.planner.follow(customer, meterId, now, kind);
      const state = mirror.state;
      const asOf = state.snapshotId === "public" ? state.asOf : null;
      seen.set(key, asOf);
      if (asOf !== null && (this.seen.has(key) ? this.seen.get(key) : -1) !== asOf) this.planner.heard(customer, meterId, now, kind);
      let view = views.get(key);
      if (view === undefined || view[0] !== mirror.rev) {
        // derived again only when the copy moved
        const func = configuration?.reducerFor(meterId)?.aggregation.func ?? "";
        view = [mirror.rev, followedOf(customer, meterId, func, state, mirror.fields.get("pub"), kind)];
      }
      this.views.set(key, view);
    }
    for (const key of this.seen.keys()) {
      if (!seen.has(key)) {
        const [kind, customer, meterId] = JSON.parse(key) as [CustomerKind, string, string];
        this.planner.unfollow(customer, meterId, kind);
      }
    }
    this.seen = seen;
    const plan = this.planner.plan(now, [...this.views.values()].map(([, view]) => view));
    return [plan.polls, plan.probes];
  }

  private async pollUrgent(): Promise<void> {
    const urgent = [...this.urgent.values()];
    this.urgent.clear();
    const now = monotonic();
    for (const customer of urgent) this.askedAt.set(customer.tag, now);
    for (const [tag, at] of this.askedAt) if (now - at >= ASKED_AGAIN) this.askedAt.delete(tag);
    const configuration = this.hooks.core.configuration;
    const meters = configuration === null ? 1 : configuration.meterReducers.size;
    for (const kind of KINDS) {
      const customers = urgent.filter((c) => c.kind === kind).map((c) => c.id);
      if (customers.length === 0) continue;
      const followed = this.followedMeters(kind);
      for (const request of urgentRequests(customers, meters, kind)) {
        const asked = new Map(requestCustomers(request).map((c): [string, string[]] => [c, followed.get(c) ?? []]));
        await this.poll(request, asked);
      }
    }
  }

  /** One customer-meters request; its figures applied, and those asked for that Polar has no
   * row for read as nothing credited, nothing consumed. */
  private async poll(request: CustomerMetersRequest, asked: Map<string, string[]> | null): Promise<void> {
    const kind = requestKind(request);
    if (asked === null) {
      const followed = this.followedMeters(kind);
      asked = new Map(requestCustomers(request).map((c): [string, string[]] => [c, followed.get(c) ?? []]));
    }
    const body = await this.get("/v1/customer-meters/", requestParams(request));
    if (body === null) {
      for (const id of requestCustomers(request)) {
        const customer = new Customer(kind, id);
        this.urgent.set(customer.tag, customer); // asked again at the next turn
      }
      return;
    }
    const [readings, rejected] = parseCustomerMeters(body);
    for (const problem of rejected) this.hooks.core.reject("public", problem.reason);
    const wanted = new Set([...asked].flatMap(([c, meters]) => meters.map((m) => JSON.stringify([c, m]))));
    for (const reading of readings) {
      const named = customerOfReading(reading, kind);
      if (named === null || !wanted.has(JSON.stringify([named, reading.meterId]))) continue;
      await this.anchors.apply(new Customer(kind, named), reading);
    }
    for (const [id, meterId] of missingRows(asked, readings, kind)) {
      await this.anchors.apply(new Customer(kind, id), kind === "external" ? noRow(id, null, meterId) : noRow(null, id, meterId));
    }
    // Heard, whatever the figures were (an urgent request's customer is not polled again next).
    const now = this.hooks.nowUs();
    for (const [customer, meters] of asked) {
      for (const meterId of meters) {
        this.planner.follow(customer, meterId, now, kind);
        this.planner.heard(customer, meterId, now, kind);
      }
    }
  }

  /** One quantities request: Polar's consumed over the customer meter's window, as of when it
   * was sent, re-anchors its consumed (the core decides what it proves). */
  private async probe(probe: QuantitiesProbe): Promise<void> {
    const body = await this.get(quantitiesPath(probe.meterId), probeParams(probe));
    if (body === null) return; // planned again once due
    const answer = parseQuantities(body);
    if (answer.total === null) {
      this.hooks.core.reject("public", answer.problem ?? "quantities");
      return;
    }
    const [consumed, sentAtUs] = [answer.total, this.sentAtUs];
    const customer = new Customer(probe.kind, probe.customer);
    await this.anchors.write(customer, probe.meterId, true, (func, fields, events) => probeAnchor(func, this.anchors.marginUs, fields, events, probe.meterId, consumed, sentAtUs));
  }

  /** A GET to Polar's API, its request taken from the shared budget first; null when it failed
   * (logged once per cause, and retried by the caller). */
  private async get(path: string, params: [string, string][]): Promise<Uint8Array | null> {
    const hooks = this.hooks;
    if (this.options.requestsPerMinute > 0) {
      const action = take(this.options.requestsPerMinute);
      const reply = await hooks.script("budget", [action.key], [String(action.perMinute), String(action.capacity), ""]);
      const wait = waitOf({ kind: "BudgetAnswered", reply } satisfies BudgetAnswered);
      if (wait) await hooks.pause(wait);
    }
    this.requests += 1;
    this.sentAtUs = hooks.nowUs();
    const url = new URL(path, hooks.serverUrl);
    for (const [name, value] of params) url.searchParams.append(name, value);
    let response: Response;
    let body: Uint8Array;
    try {
      response = await fetch(url, {
        headers: { authorization: `Bearer ${hooks.accessToken}`, "user-agent": hooks.userAgent },
        signal: AbortSignal.any([AbortSignal.timeout(30_000), hooks.closing]),
      });
      body = await readAtMost(response, MAX_BODY_BYTES + 1);
    } catch (exc) {
      if (hooks.closed()) return null;
      const cause = (exc as { cause?: { code?: string; message?: string } }).cause;
      this.failed(`${path}: ${cause?.code ?? cause?.message ?? (exc as Error).message ?? String(exc)}`);
      await hooks.pause(RETRY);
      return null;
    }
    if (response.status !== 200) {
      this.failed(`${path}: HTTP ${response.status}`);
      await hooks.pause(RETRY);
      return null;
    }
    this.lastError = null;
    return body;
  }

  /** Say a failure once per cause (`source`: what failed), and keep it for the status. */
  private failed(error: string, source = "Polar's public API"): void {
    if (error !== this.lastError) this.hooks.log.warn(`outpost: the public mode's poll loop: ${source} failed (retried): ${error}`);
    this.lastError = error;
  }

  /** Verify a webhook delivery and apply what it carries (anchors.ts); the HTTP status to answer. */
  handleWebhook(body: Uint8Array, headers: Headers): Promise<number> {
    return this.anchors.handleWebhook(body, headers, this.mode);
  }
}
