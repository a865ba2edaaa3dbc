/** The public-API mode's state for one process, sans I/O (outpost_core/_public_book.py): the
 * followed customer meters, the poll planner, and what to do with a webhook delivery, a
 * customer-meters page or a quantities answer. Peers' garbage is counted in `rejections`; a
 * caller's misuse throws UsageError. */

import { UsageError } from "./errors.js";
import { DEFAULT_MARGIN_US, type LocalBalance, MeterLedger, type Outcome, type PolarReading } from "./publicLedger.js";
import { type Followed, type Plan, PollPlanner } from "./publicPolls.js";
import { parseCustomerMeters, parseStateChanged } from "./publicReadings.js";
import { secretKey, verify } from "./webhookSignature.js";

export type Observed = [string, string, Outcome];

export interface WebhookAnswer {
  /** 204 when taken, 401 when the signature does not hold (Polar retries: harmless). */
  status: number;
  outcomes: Observed[];
  reason: string;
}

const keyOf = (customer: string, meterId: string): string => JSON.stringify([customer, meterId]);

export class PublicBook {
  readonly ledgers = new Map<string, { customer: string; meterId: string; ledger: MeterLedger }>();
  readonly rejections = new Map<string, number>();
  private readonly events = new Map<string, string[]>();
  private readonly key: Uint8Array | null;

  constructor(
    readonly planner: PollPlanner,
    webhookSecret: string | null = null,
    readonly marginUs = DEFAULT_MARGIN_US,
  ) {
    this.key = webhookSecret === null ? null : secretKey(webhookSecret);
  }

  private reject(kind: string, count = 1): void {
    if (count > 0) this.rejections.set(kind, (this.rejections.get(kind) ?? 0) + count);
  }

  follow(customer: string, meterId: string, aggregation: string, nowUs: number): void {
    const key = keyOf(customer, meterId);
    if (!this.ledgers.has(key)) this.ledgers.set(key, { customer, meterId, ledger: new MeterLedger(aggregation, this.marginUs) });
    this.planner.follow(customer, meterId, nowUs);
  }

  unfollow(customer: string, meterId: string): void {
    this.ledgers.delete(keyOf(customer, meterId));
    this.planner.unfollow(customer, meterId);
  }

  private ledger(customer: string, meterId: string): MeterLedger {
    const found = this.ledgers.get(keyOf(customer, meterId));
    if (found === undefined) throw new UsageError(`customer meter (${customer}, ${meterId}) is not followed`);
    return found.ledger;
  }

  record(customer: string, meterId: string, eventId: string, value = 1, key: string | null = null): void {
    this.ledger(customer, meterId).record(eventId, value, key);
    const keys = this.events.get(eventId) ?? [];
    const k = keyOf(customer, meterId);
    if (!keys.includes(k)) keys.push(k);
    this.events.set(eventId, keys);
  }

  private each(eventIds: Iterable<string>, act: (ledger: MeterLedger, id: string) => void): void {
    for (const id of eventIds) {
      for (const k of this.events.get(id) ?? []) {
        const found = this.ledgers.get(k);
        if (found !== undefined) act(found.ledger, id);
      }
      this.events.delete(id);
    }
  }

  acknowledged(eventIds: Iterable<string>, atUs: number): void {
    this.each(eventIds, (ledger, id) => ledger.acknowledged([id], atUs));
  }

  discard(eventIds: Iterable<string>): void {
    this.each(eventIds, (ledger, id) => ledger.discard([id]));
  }

  handleWebhook(body: Uint8Array, headers: Record<string, string | undefined>, nowUs: number): WebhookAnswer {
    if (this.key === null) throw new UsageError("handleWebhook needs the webhook secret (whsec_...) configured");
    const verdict = verify(this.key, headers, body, nowUs / 1e6);
    if (!verdict.genuine) {
      this.reject("webhook_signature");
      return { status: 401, outcomes: [], reason: verdict.reason };
    }
    const [readings, rejected] = parseStateChanged(body);
    this.reject("webhook_row", rejected.length);
    return { status: 204, outcomes: this.observe(readings, nowUs), reason: "" };
  }

  handlePage(body: Uint8Array, nowUs: number): Observed[] {
    const [readings, rejected] = parseCustomerMeters(body);
    this.reject("page_row", rejected.length);
    return this.observe(readings, nowUs);
  }

  handleProbe(customer: string, meterId: string, total: unknown, sentAtUs: number, lagUs: number): boolean {
    if (typeof total !== "number" || !Number.isFinite(total)) {
      this.reject("probe_total");
      return false;
    }
    const found = this.ledgers.get(keyOf(customer, meterId));
    return found !== undefined && found.ledger.observeProbe(total, sentAtUs, lagUs) !== "probe_unused";
  }

  private observe(readings: PolarReading[], nowUs: number): Observed[] {
    const outcomes: Observed[] = [];
    for (const reading of readings) {
      for (const customer of [reading.externalCustomerId, reading.customerId]) {
        const found = customer === null ? undefined : this.ledgers.get(keyOf(customer, reading.meterId));
        if (found !== undefined && customer !== null) {
          outcomes.push([customer, reading.meterId, found.ledger.observe(reading)]);
          this.planner.heard(customer, reading.meterId, nowUs);
          break;
        }
      }
    }
    return outcomes;
  }

  plan(nowUs: number): Plan {
    const views: Followed[] = [...this.ledgers.values()].map(({ customer, meterId, ledger }) => ({
      customer,
      meterId,
      aggregation: ledger.aggregation,
      balance: ledger.balance().balance,
      pendingEvents: ledger.entries.size,
      windowStartUs: ledger.resetHintUs,
    }));
    return this.planner.plan(nowUs, views);
  }

  balance(customer: string, meterId: string): LocalBalance {
    return this.ledger(customer, meterId).balance();
  }
}
