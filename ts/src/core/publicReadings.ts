/** Polar's customer meters from a `customer.state_changed` webhook body or a
 * `GET /v1/customer-meters/` page (outpost_core/_public_readings.py): bad rows are rejections
 * the caller counts; nothing throws. */

import type { PolarReading } from "./publicLedger.js";

export const MAX_BODY_BYTES = 8 * 1024 * 1024;

export interface ReadingRejected {
  reason: string;
}

export type Parsed = [PolarReading[], ReadingRejected[]];

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

function load(body: Uint8Array): unknown {
  if (body.length > MAX_BODY_BYTES) return { rejected: `body of ${body.length} bytes is over ${MAX_BODY_BYTES}` };
  try {
    return { value: JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body)) as unknown };
  } catch (error) {
    return { rejected: `not JSON: ${(error as Error).name}` };
  }
}

const finite = (v: unknown): number | null => (typeof v === "number" && Number.isFinite(v) ? v : null);
const text = (v: unknown): string | null => (typeof v === "string" && v !== "" ? v : null);

function instant(v: unknown, name = "modified_at"): number | null | ReadingRejected {
  if (v === null || v === undefined) return null;
  if (typeof v !== "string") return { reason: `${name} is not a string` };
  if (!/(Z|[+-]\d\d:?\d\d)$/.test(v)) return { reason: `${name} ${JSON.stringify(v.slice(0, 40))} has no zone` };
  const ms = Date.parse(v);
  if (Number.isNaN(ms)) return { reason: `${name} ${JSON.stringify(v.slice(0, 40))} is not an ISO instant` };
  const micros = /\.(\d{1,6})/.exec(v);
  const extra = micros ? Number((micros[1] as string).padEnd(6, "0")) % 1000 : 0;
  return ms * 1000 + extra;
}

export function readingOf(row: unknown, external: string | null, customerId: string | null): PolarReading | ReadingRejected {
  if (!isObject(row)) return { reason: "a meter row is not an object" };
  const meterId = text(row.meter_id);
  const consumed = finite(row.consumed_units);
  const credited = finite(row.credited_units);
  const balance = finite(row.balance);
  const modified = instant(row.modified_at);
  if (meterId === null) return { reason: "meter_id is missing or not a string" };
  if (consumed === null || credited === null || balance === null) {
    return { reason: `meter ${meterId}: a figure is missing or not a finite number` };
  }
  if (!Number.isInteger(credited)) return { reason: `meter ${meterId}: credited_units is not whole` };
  if (modified !== null && typeof modified === "object") return modified;
  if (external === null && customerId === null) return { reason: `meter ${meterId}: no customer id` };
  return { externalCustomerId: external, customerId, meterId, consumed, credited, balance, modifiedAtUs: modified };
}

function rows(items: unknown[], external: string | null, customerId: string | null): Parsed {
  const readings: PolarReading[] = [];
  const rejected: ReadingRejected[] = [];
  for (const item of items) {
    const outcome = readingOf(item, external, customerId);
    if ("meterId" in outcome) readings.push(outcome);
    else rejected.push(outcome);
  }
  return [readings, rejected];
}

export function parseStateChanged(body: Uint8Array): Parsed {
  const loaded = load(body) as { value?: unknown; rejected?: string };
  if (loaded.rejected !== undefined) return [[], [{ reason: loaded.rejected }]];
  const data = loaded.value;
  if (!isObject(data) || data.type !== "customer.state_changed") return [[], []];
  const state = data.data;
  if (!isObject(state) || !Array.isArray(state.active_meters)) {
    return [[], [{ reason: "customer.state_changed without data.active_meters" }]];
  }
  const [readings, rejected] = rows(state.active_meters, text(state.external_id), text(state.id));
  const starts = periodStarts(state.active_subscriptions, rejected);
  return [readings.map((r) => ({ ...r, resetAtUs: starts.get(r.meterId) ?? null })), rejected];
}

/** Meter id -> the latest current_period_start of the active subscriptions carrying it
 * (meters[].meter_id); a subscription that does not read is a rejection. */
function periodStarts(subscriptions: unknown, rejected: ReadingRejected[]): Map<string, number> {
  const starts = new Map<string, number>();
  for (const subscription of Array.isArray(subscriptions) ? subscriptions : []) {
    const start = isObject(subscription) ? instant(subscription.current_period_start, "current_period_start") : null;
    const meters = isObject(subscription) ? subscription.meters : undefined;
    if (typeof start !== "number" || !Array.isArray(meters)) {
      rejected.push({ reason: "a subscription without its period start or meters" });
      continue;
    }
    for (const meter of meters) {
      const meterId = isObject(meter) ? text(meter.meter_id) : null;
      if (meterId !== null) starts.set(meterId, Math.max(start, starts.get(meterId) ?? start));
    }
  }
  return starts;
}

export function parseCustomerMeters(body: Uint8Array): Parsed {
  const loaded = load(body) as { value?: unknown; rejected?: string };
  if (loaded.rejected !== undefined) return [[], [{ reason: loaded.rejected }]];
  const data = loaded.value;
  if (!isObject(data) || !Array.isArray(data.items)) return [[], [{ reason: "a customer-meters page without items" }]];
  const readings: PolarReading[] = [];
  const rejected: ReadingRejected[] = [];
  for (const item of data.items) {
    const customer = isObject(item) ? item.customer : undefined;
    let external = isObject(customer) ? text(customer.external_id) : null;
    if (external === null && isObject(item)) external = text(item.external_customer_id);
    const customerId = isObject(item) ? text(item.customer_id) : null;
    const [found, bad] = rows([item], external, customerId);
    readings.push(...found);
    rejected.push(...bad);
  }
  return [readings, rejected];
}
