/** Which customer meters to ask Polar about, and when, within a request budget
 * (outpost_core/_public_polls.py): never-reported ones first, then quantities probes (count and
 * sum meters at or below the band, or busy with a figure older than 10 minutes; at most one a
 * minute each), then ones not reported for the poll interval; each request names customers x
 * meters within 100 rows; a token bucket of `perMinute` (at most a fifteenth of a minute's worth
 * at once) paces them. */

import { UsageError } from "./errors.js";
import type { CustomerKind } from "./keys.js";

export const MAX_ROWS = 100;
const SECOND_US = 1_000_000;
export const DAY_US = 86_400 * SECOND_US;
/** A probe with no known window start looks back 30 days. */
export const PROBE_SPAN_US = 30 * DAY_US;
/** The finest interval Polar serves over a span (its buckets start at the window's start
 * truncated to one: the finer, the less of an earlier window they take in). */
const INTERVALS: [number, QuantitiesInterval][] = [
  [7 * DAY_US, "hour"],
  [366 * DAY_US, "day"],
  [1460 * DAY_US, "month"],
];

export type QuantitiesInterval = "hour" | "day" | "month" | "year";

export function intervalFor(spanUs: number): QuantitiesInterval {
  return INTERVALS.find(([most]) => spanUs <= most)?.[1] ?? "year";
}

/** The query parameter that names a customer of each kind: by the merchant's external id, or by
 * Polar's customer id. */
export const ID_PARAMS: Readonly<Record<CustomerKind, string>> = { external: "external_customer_id", customer: "customer_id" };
export const KINDS: readonly CustomerKind[] = ["external", "customer"];

/** One GET /v1/customer-meters/: customers of one kind (Polar ANDs its filters). */
export interface CustomerMetersRequest {
  externalCustomerIds: string[];
  meterIds: string[];
  /** Customers named by Polar's customer id (then externalCustomerIds is empty). */
  customerIds?: string[];
}

export function requestKind(request: CustomerMetersRequest): CustomerKind {
  return request.customerIds?.length ? "customer" : "external";
}

export function requestCustomers(request: CustomerMetersRequest): string[] {
  return request.customerIds?.length ? request.customerIds : request.externalCustomerIds;
}

export function requestFor(kind: CustomerKind, customers: string[], meterIds: string[]): CustomerMetersRequest {
  return kind === "customer" ? { externalCustomerIds: [], meterIds, customerIds: customers } : { externalCustomerIds: customers, meterIds };
}

export function requestParams(request: CustomerMetersRequest): [string, string][] {
  const name = ID_PARAMS[requestKind(request)];
  return [
    ...requestCustomers(request).map((c): [string, string] => [name, c]),
    ...request.meterIds.map((m): [string, string] => ["meter_id", m]),
    ["limit", String(MAX_ROWS)],
  ];
}

export interface QuantitiesProbe {
  customer: string;
  meterId: string;
  startUs: number;
  endUs: number;
  interval: QuantitiesInterval;
  kind: CustomerKind;
}

export interface Followed {
  customer: string;
  meterId: string;
  aggregation: string;
  balance: number | null;
  pendingEvents: number;
  windowStartUs: number | null;
  /** external (the merchant's id, the default) or customer (Polar's customer id). */
  kind?: CustomerKind;
}

export interface Plan {
  polls: CustomerMetersRequest[];
  probes: QuantitiesProbe[];
}

export interface PlannerSettings {
  perMinute: number;
  pollEveryS?: number;
  probeAfterS?: number;
  probeEveryS?: number;
  probeBand?: number;
  retryS?: number;
}

const keyOf = (customer: string, meterId: string, kind: CustomerKind = "external"): string => JSON.stringify([kind, customer, meterId]);
const keyOfView = (view: Followed): string => keyOf(view.customer, view.meterId, view.kind);

export class PollPlanner {
  readonly perMinute: number;
  readonly pollEveryS: number;
  readonly probeAfterS: number;
  readonly probeEveryS: number;
  readonly probeBand: number;
  readonly retryS: number;
  tokens = 0;
  refilledAtUs: number | null = null;
  readonly heardAt = new Map<string, number>();
  readonly probedAt = new Map<string, number>();
  readonly askedAt = new Map<string, number>();
  readonly followedAt = new Map<string, number>();

  constructor(settings: PlannerSettings) {
    this.perMinute = settings.perMinute;
    this.pollEveryS = settings.pollEveryS ?? 300;
    this.probeAfterS = settings.probeAfterS ?? 600;
    this.probeEveryS = settings.probeEveryS ?? 60;
    this.probeBand = settings.probeBand ?? 0;
    this.retryS = settings.retryS ?? 10;
    if (!(this.perMinute > 0)) throw new UsageError("perMinute must be > 0");
    for (const v of [this.pollEveryS, this.probeAfterS, this.probeEveryS, this.retryS]) {
      if (!(v > 0)) throw new UsageError("the planner's intervals must be > 0");
    }
  }

  get capacity(): number {
    return Math.max(1, this.perMinute / 15);
  }

  follow(customer: string, meterId: string, nowUs: number, kind: CustomerKind = "external"): void {
    const key = keyOf(customer, meterId, kind);
    if (!this.followedAt.has(key)) this.followedAt.set(key, nowUs);
  }

  unfollow(customer: string, meterId: string, kind: CustomerKind = "external"): void {
    const key = keyOf(customer, meterId, kind);
    for (const table of [this.heardAt, this.probedAt, this.askedAt, this.followedAt]) table.delete(key);
  }

  heard(customer: string, meterId: string, nowUs: number, kind: CustomerKind = "external"): void {
    this.heardAt.set(keyOf(customer, meterId, kind), nowUs);
  }

  /** Polar was asked about this customer meter at nowUs: not due for a while. */
  asked(customer: string, meterId: string, nowUs: number, kind: CustomerKind = "external"): void {
    this.askedAt.set(keyOf(customer, meterId, kind), nowUs);
  }

  private refill(nowUs: number): void {
    if (this.refilledAtUs === null) this.tokens = this.capacity;
    else if (nowUs > this.refilledAtUs) {
      const elapsedS = (nowUs - this.refilledAtUs) / SECOND_US;
      this.tokens = Math.min(this.capacity, this.tokens + (elapsedS * this.perMinute) / 60);
    }
    this.refilledAtUs = Math.max(nowUs, this.refilledAtUs ?? nowUs);
  }

  private due(key: string, nowUs: number): boolean {
    const asked = this.askedAt.get(key);
    const heard = this.heardAt.get(key);
    if (heard === undefined) return asked === undefined || nowUs - asked >= this.retryS * SECOND_US;
    return nowUs - Math.max(heard, asked ?? heard) >= this.pollEveryS * SECOND_US;
  }

  plan(nowUs: number, followed: Iterable<Followed>): Plan {
    this.refill(nowUs);
    const all = [...followed].filter((f) => this.followedAt.has(keyOfView(f)));
    const views = all.filter((f) => this.due(keyOfView(f), nowUs));
    const never = views
      .filter((f) => !this.heardAt.has(keyOfView(f)))
      .sort((a, b) => (this.followedAt.get(keyOfView(a)) as number) - (this.followedAt.get(keyOfView(b)) as number));
    const stale = views
      .filter((f) => this.heardAt.has(keyOfView(f)))
      .sort((a, b) => (this.heardAt.get(keyOfView(a)) as number) - (this.heardAt.get(keyOfView(b)) as number));
    const polls = PollPlanner.batches(never).slice(0, Math.floor(this.tokens));
    this.tokens -= polls.length;
    const probes = all.map((f) => this.probe(f, nowUs)).filter((p): p is QuantitiesProbe => p !== null);
    const chosenProbes = probes.slice(0, Math.floor(this.tokens));
    this.tokens -= chosenProbes.length;
    for (const p of chosenProbes) this.probedAt.set(keyOf(p.customer, p.meterId, p.kind), nowUs);
    const routine = PollPlanner.batches(stale).slice(0, Math.floor(this.tokens));
    this.tokens -= routine.length;
    for (const request of [...polls, ...routine]) {
      const kind = requestKind(request);
      for (const c of requestCustomers(request)) for (const m of request.meterIds) this.asked(c, m, nowUs, kind);
    }
    return { polls: [...polls, ...routine], probes: chosenProbes };
  }

  private probe(view: Followed, nowUs: number): QuantitiesProbe | null {
    const key = keyOfView(view);
    const heard = this.heardAt.get(key);
    if ((view.aggregation !== "count" && view.aggregation !== "sum") || heard === undefined || view.balance === null) return null;
    const last = this.probedAt.get(key);
    if (last !== undefined && nowUs - last < this.probeEveryS * SECOND_US) return null;
    const nearZero = view.balance <= this.probeBand;
    const busyAndOld = view.pendingEvents > 0 && nowUs - heard >= this.probeAfterS * SECOND_US;
    if (!nearZero && !busyAndOld) return null;
    const startUs = view.windowStartUs ?? nowUs - PROBE_SPAN_US;
    const endUs = nowUs + DAY_US;
    return { customer: view.customer, meterId: view.meterId, startUs, endUs, interval: intervalFor(endUs - startUs), kind: view.kind ?? "external" };
  }

  /** Requests for these customer meters, each within 100 rows and of one kind of customer, in
   * the order of the first customer meter each asks about. */
  static batches(views: Followed[]): CustomerMetersRequest[] {
    const firsts: [number, CustomerMetersRequest][] = [];
    for (const kind of KINDS) {
      let first = 0;
      let customers: string[] = [];
      let meters: string[] = [];
      views.forEach((view, index) => {
        if ((view.kind ?? "external") !== kind) return;
        let moreCustomers = customers.includes(view.customer) ? customers : [...customers, view.customer];
        let moreMeters = meters.includes(view.meterId) ? meters : [...meters, view.meterId];
        if (customers.length > 0 && moreCustomers.length * moreMeters.length > MAX_ROWS) {
          firsts.push([first, requestFor(kind, customers, meters)]);
          customers = [];
          moreCustomers = [view.customer];
          moreMeters = [view.meterId];
        }
        if (customers.length === 0) first = index;
        customers = moreCustomers;
        meters = moreMeters;
      });
      if (customers.length > 0) firsts.push([first, requestFor(kind, customers, meters)]);
    }
    return firsts.sort((a, b) => a[0] - b[0]).map(([, request]) => request);
  }
}
