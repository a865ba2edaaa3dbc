/** The public-API mode written into the existing Redis layout, sans I/O
 * (outpost_core/_public_anchoring.py).
 *
 * Polar's figure for a (customer, meter) is the anchor of the identity's state hash, and the
 * identity's pending events are the ledger (publicLedger.ts). This module turns what a driver
 * read from Redis (the state hash's fields and the identity's pending events) plus a Polar
 * reading into the arguments of lua/apply_anchor.lua: `p` (Polar's consumed as the aggregate
 * the reducer's aggregation reads), `c:<meter>` (credited), `cu` = 0 (every local event stays
 * pending until pruned), `sa` (the reading's modified_at, µs, 0 when null), `sid` = "public",
 * `pub` (the ledger's persistent part, so any instance rebuilds it) and the events fields the
 * prune rule drops.
 *
 * A meter's reducer is named by the meter id itself, so every instance and every SDK derive it
 * alike. Nothing here throws because of what Redis or Polar held: an unreadable `pub` or event
 * is named in `problems` and left aside (an unreadable event is never pruned: it keeps
 * counting, the safe side). */

import { Aggregate, isNumber, isObject, parseNumber } from "./aggregate.js";
import { UsageError } from "./errors.js";
import { MeterLedger, type Outcome, type PolarReading } from "./publicLedger.js";
import { UUID_PATTERN, canonicalUuid } from "./event.js";
import type { CustomerKind } from "./keys.js";
import { type CustomerMetersRequest, MAX_ROWS, requestFor } from "./publicPolls.js";

export const PUBLIC_SID = "public";
/** The field of a cached configuration payload that names the mode it was built for. */
export const MODE_FIELD = "mode";
export const PUB_VERSION = 1;

export type Mode = "auto" | "snapshots" | "public";
export type RunningMode = "snapshots" | "public";
export const MODES: readonly Mode[] = ["auto", "snapshots", "public"];

const BOUNDED = new Set(["count", "sum", "max", "unique"]);
const RELAYED = new Set(["avg", "min"]);

/** The public mode's reducer of a meter: one per meter, named by the meter id. */
export function reducerId(meterId: string): string {
  return meterId;
}

function peerJson(text: string | Uint8Array): { value: unknown } | { problem: string } {
  try {
    const decoded = typeof text === "string" ? text : new TextDecoder("utf-8", { fatal: true }).decode(text);
    return { value: JSON.parse(decoded) as unknown };
  } catch (exc) {
    return { problem: `not JSON (${(exc as Error).name})` };
  }
}

// -- configuration from GET /v1/meters/ ----------------------------------------------------------

export type Meter = Record<string, unknown> & { id: string };

export interface MetersPage {
  meters: Meter[];
  maxPage: number;
  problems: string[];
}

/** One page of `GET /v1/meters/`; a body that is not one gives no meter and a problem. */
export function parseMetersPage(body: string | Uint8Array): MetersPage {
  const parsed = peerJson(body);
  if ("problem" in parsed) return { meters: [], maxPage: 0, problems: [`meters page: ${parsed.problem}`] };
  const data = parsed.value;
  const items = isObject(data) ? data.items : undefined;
  if (!Array.isArray(items)) return { meters: [], maxPage: 0, problems: ["meters page without items"] };
  const pagination = (data as Record<string, unknown>).pagination;
  const found = isObject(pagination) ? pagination.max_page : undefined;
  const maxPage = Number.isSafeInteger(found) ? (found as number) : 1;
  const meters: Meter[] = [];
  const problems: string[] = [];
  for (const item of items) {
    if (isObject(item) && typeof item.id === "string" && item.id !== "") meters.push(item as Meter);
    else problems.push("a meter without an id");
  }
  return { meters, maxPage, problems };
}

/** The configuration payload of the public mode: one reducer per meter (its id the meter id),
 * sorted so that every instance builds the same text; marked with the mode, so an instance of
 * the other mode refuses to mix layouts (cachedMode). */
export function publicConfiguration(meters: readonly Meter[]): Record<string, unknown> {
  const reducers = new Map<string, Record<string, unknown>>();
  for (const meter of meters) {
    reducers.set(meter.id, {
      id: reducerId(meter.id),
      filter: meter.filter ?? null,
      aggregation: meter.aggregation ?? null,
      meter_ids: [meter.id],
    });
  }
  const ids = [...reducers.keys()].sort(byCodePoint);
  return { [MODE_FIELD]: "public", reducers: ids.map((id) => reducers.get(id)) };
}

/** The mode a cached configuration was built for (null: unreadable). */
export function cachedMode(text: string | Uint8Array): RunningMode | null {
  const parsed = peerJson(text);
  if ("problem" in parsed || !isObject(parsed.value)) return null;
  return parsed.value[MODE_FIELD] === "public" ? "public" : "snapshots";
}

// -- choosing the mode ---------------------------------------------------------------------------

export function checkMode(mode: unknown): Mode {
  if (!MODES.includes(mode as Mode)) throw new UsageError(`mode must be one of ${MODES.join(", ")}, got ${JSON.stringify(mode)}`);
  return mode as Mode;
}

/** The mode to run and why. `upgradeStatus`: what Polar answered the WebSocket upgrade of
 * /v1/outpost/ (101 when it opened; null when Polar could not be reached); `cached`: the mode
 * of the configuration cached in Redis, if any. */
export function chooseMode(requested: Mode, upgradeStatus: number | null, cached: RunningMode | null): [RunningMode, string] {
  checkMode(requested);
  if (requested !== "auto") return [requested, `mode=${JSON.stringify(requested)} was asked`];
  if (upgradeStatus === 404) return ["public", "Polar answers 404 on /v1/outpost/: it serves only its public API"];
  if (upgradeStatus !== null) return ["snapshots", `Polar serves /v1/outpost/ (HTTP ${upgradeStatus})`];
  if (cached !== null) return [cached, "Polar is unreachable: the mode of the configuration cached in Redis"];
  return ["snapshots", "Polar is unreachable and Redis caches no configuration"];
}

/** Why this instance cannot share the Redis (another mode's configuration is cached), or null. */
export function modeConflict(mode: RunningMode, cached: RunningMode | null): string | null {
  if (cached === null || cached === mode) return null;
  return (
    `this instance runs the ${mode} mode but the configuration cached in Redis was built ` +
    `by an instance of the ${cached} mode: both cannot share one Redis (set mode= alike)`
  );
}

// -- the ledger in the state hash ----------------------------------------------------------------

const numberOf = (value: unknown): number | null => (isNumber(value) ? value : null);
const instantOf = (value: unknown): number | null => (Number.isSafeInteger(value) ? (value as number) : null);
const byCodePoint = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

/** The ledger's persistent part (its entries are the identity's pending events). */
export function encodePub(ledger: MeterLedger): string {
  const anchor = ledger.anchor;
  const probe = ledger.probe;
  const data: Record<string, unknown> = {
    v: PUB_VERSION,
    a: anchor === null ? null : [anchor.consumed, anchor.credited, anchor.balance, anchor.modifiedAtUs],
    b: ledger.baseline,
    h: ledger.resetHintUs,
    r: ledger.rejections,
    q: probe === null ? null : [probe.consumed, probe.sentAtUs, probe.lagUs],
    k: [...ledger.carried].sort(byCodePoint),
  };
  if (ledger.cap !== null) data.u = ledger.cap; // (written only when it holds: older readers ignore it)
  return JSON.stringify(data);
}

/** Restore the persistent part into `ledger` (a fresh one, its entries read); what is
 * unreadable is left out and named in `problems`. */
export function decodePub(text: string | undefined, ledger: MeterLedger, problems: string[]): void {
  if (text === undefined) return;
  const parsed = peerJson(text);
  if ("problem" in parsed) {
    problems.push(`pub: ${parsed.problem}`);
    return;
  }
  const data = parsed.value;
  if (!isObject(data) || data.v !== PUB_VERSION) {
    problems.push("pub: not a version 1 object");
    return;
  }
  const anchor = data.a;
  if (Array.isArray(anchor) && anchor.length === 4) {
    const [consumed, credited, balance] = anchor.slice(0, 3).map(numberOf);
    const modified = anchor[3] as unknown;
    if (
      consumed !== null &&
      consumed !== undefined &&
      credited !== null &&
      credited !== undefined &&
      balance !== null &&
      balance !== undefined &&
      (modified === null || instantOf(modified) !== null)
    ) {
      ledger.anchor = { externalCustomerId: null, customerId: null, meterId: "", consumed, credited: Math.trunc(credited), balance, modifiedAtUs: instantOf(modified) };
    } else {
      problems.push("pub: an unreadable anchor");
    }
  } else if (anchor !== null && anchor !== undefined) {
    problems.push("pub: an unreadable anchor");
  }
  ledger.baseline = numberOf(data.b) ?? 0;
  ledger.resetHintUs = instantOf(data.h);
  ledger.rejections = instantOf(data.r) ?? 0;
  const probe = data.q;
  if (Array.isArray(probe) && probe.length === 3) {
    const consumed = numberOf(probe[0]);
    const sentAtUs = instantOf(probe[1]);
    const lagUs = instantOf(probe[2]);
    if (consumed !== null && sentAtUs !== null && lagUs !== null) ledger.probe = { consumed, sentAtUs, lagUs };
  }
  ledger.cap = capOf(data.u, ledger, problems);
  ledger.carried.clear();
  if (Array.isArray(data.k)) {
    for (const field of data.k) if (typeof field === "string" && ledger.entries.has(field)) ledger.carried.add(field);
  }
}

/** The cap a state hash holds, never below the anchor's consumed less the acknowledged events (a
 * cap written by Outpost never is: below it, the balance would read above Polar's). */
function capOf(value: unknown, ledger: MeterLedger, problems: string[]): number | null {
  const cap = numberOf(value);
  if (cap === null || ledger.anchor === null) return null;
  let acked = 0;
  for (const entry of ledger.entries.values()) if (entry.ackedAtUs !== null) acked += entry.value;
  const floor = ledger.anchor.consumed - acked;
  if (cap < floor) {
    problems.push("pub: a cap below Polar's consumed less the acknowledged events");
    return floor;
  }
  return cap;
}

/** An events-hash value: "<value>" or "<value> <acknowledged at µs>"; null when unreadable. */
function eventOf(text: string): [number, number | null] | null {
  const parts = text.split(" ");
  if (parts.length > 2) return null;
  const value = parseNumber(parts[0] as string);
  if (value === null) return null;
  if (parts.length === 1) return [value, null];
  if (!/^-?[0-9]{1,20}$/.test(parts[1] as string)) return null;
  const acked = Number(parts[1]);
  return Number.isSafeInteger(acked) ? [value, acked] : null;
}

/** The MeterLedger a state hash and its pending events (events field -> value) hold. */
export function ledgerOf(
  aggregation: string,
  marginUs: number,
  fields: Readonly<Record<string, string>>,
  events: Readonly<Record<string, string>>,
  problems: string[],
): MeterLedger {
  const ledger = new MeterLedger(aggregation, marginUs);
  for (const [field, text] of Object.entries(events)) {
    const parsed = eventOf(text);
    if (parsed === null) {
      problems.push(`event ${field.slice(0, 80)}: unreadable value`);
      continue;
    }
    const [value, ackedAtUs] = parsed;
    ledger.entries.set(field, { value: Math.max(0, value), key: null, ackedAtUs });
  }
  decodePub(fields.pub, ledger, problems);
  return ledger;
}

/** `p`: Polar's consumed as the aggregate the reducer's aggregation reads. */
export function polarAggregate(aggregation: string, consumed: number): string {
  if (consumed === 0) return new Aggregate().encode();
  if (aggregation === "count") {
    const count = Math.max(0, Math.ceil(consumed)); // a count is whole: round up, the safe side
    return new Aggregate(count, consumed, consumed, consumed).encode();
  }
  return new Aggregate(1, consumed, consumed, consumed).encode();
}

/** The arguments of apply_anchor.lua (see its header). */
export class AnchorWrite {
  constructor(
    /** The revision read ("": the hash did not exist): compare-and-set. */
    readonly expectedRev: string,
    readonly meterId: string,
    readonly credited: string,
    readonly polar: string,
    readonly asOf: string,
    readonly pub: string,
    readonly removed: readonly string[],
  ) {}

  args(channel: string, known: number): string[] {
    return [channel, this.expectedRev, String(known), this.meterId, this.credited, this.polar, "0", this.asOf, PUBLIC_SID, this.pub, String(this.removed.length), ...this.removed];
  }
}

export interface Anchoring {
  outcome: Outcome;
  /** null: nothing to write (a stale reading). */
  write: AnchorWrite | null;
  problems: string[];
  /** The ledger's count of readings whose check failed, after this one. */
  rejections: number;
}

/** Observe `reading` on the ledger the state hash (`fields`) and its pending events (`events`:
 * events field -> value) hold, and say what to write. */
export function anchor(
  aggregation: string,
  marginUs: number,
  fields: Readonly<Record<string, string>>,
  events: Readonly<Record<string, string>>,
  reading: PolarReading,
): Anchoring {
  if ((!BOUNDED.has(aggregation) && !RELAYED.has(aggregation)) || aggregation === "unique") {
    throw new UsageError(`the public mode cannot anchor a ${JSON.stringify(aggregation)} meter`);
  }
  const problems: string[] = [];
  const ledger = ledgerOf(aggregation, marginUs, fields, events, problems);
  const before = new Set(ledger.entries.keys());
  const outcome = ledger.observe(reading);
  if (outcome === "stale") return { outcome, write: null, problems, rejections: ledger.rejections };
  // (avg and min: the ledger drops what the reading should include, with no check possible.)
  const write = anchorWrite(aggregation, fields, ledger, before, reading.meterId, reading);
  return { outcome, write, problems, rejections: ledger.rejections };
}

/** What to write once `ledger` (read from the state hash `fields`, its entries then `before`) took
 * `reading` as its anchor: the new basis, the entries it dropped, all on condition the hash's
 * revision is still the one read. */
export function anchorWrite(
  aggregation: string,
  fields: Readonly<Record<string, string>>,
  ledger: MeterLedger,
  before: ReadonlySet<string>,
  meterId: string,
  reading: PolarReading,
): AnchorWrite {
  return new AnchorWrite(
    fields.rev ?? "",
    meterId,
    String(reading.credited),
    polarAggregate(aggregation, ledger.consumedBasis()),
    String(reading.modifiedAtUs ?? 0),
    encodePub(ledger),
    [...before].filter((field) => !ledger.entries.has(field)).sort(byCodePoint),
  );
}

/** What a customer meter Polar has no row for reads as: nothing credited, nothing consumed (the
 * safe side), with no modified_at: it anchors only where nothing else did. */
export function noRow(externalCustomerId: string | null, customerId: string | null, meterId: string): PolarReading {
  return { externalCustomerId, customerId, meterId, consumed: 0, credited: 0, balance: 0, modifiedAtUs: null };
}

/** Whether a state hash holds a public anchor (a read of it is ready). */
export function isAnchored(fields: Readonly<Record<string, string>>): boolean {
  return fields.sid === PUBLIC_SID && "cu" in fields;
}


/** Requests for every meter of these customers (a first read waits for them), all of one kind:
 * each names as many customers as keep its rows (customers x meters) within one page of 100. */
export function urgentRequests(customers: readonly string[], meters: number, kind: CustomerKind = "external"): CustomerMetersRequest[] {
  const perRequest = Math.max(1, Math.floor(MAX_ROWS / Math.max(1, meters)));
  const requests: CustomerMetersRequest[] = [];
  for (let i = 0; i < customers.length; i += perRequest) requests.push(requestFor(kind, customers.slice(i, i + perRequest), []));
  return requests;
}

/** The reading's customer as a request of `kind` named it (Polar's id in one spelling). */
export function customerOfReading(reading: PolarReading, kind: CustomerKind): string | null {
  if (kind === "external") return reading.externalCustomerId;
  const found = reading.customerId;
  return found !== null && UUID_PATTERN.test(found) ? canonicalUuid(found) : found;
}

/** (customer, meter) asked for (customer -> its followed meters, customers of `kind`) that no
 * reading answered: Polar has no row for them yet, they read as noRow(). */
export function missingRows(asked: ReadonlyMap<string, readonly string[]>, readings: readonly PolarReading[], kind: CustomerKind = "external"): [string, string][] {
  const answered = new Set(readings.map((r) => JSON.stringify([customerOfReading(r, kind), r.meterId])));
  const missing: [string, string][] = [];
  for (const [customer, meters] of asked) {
    for (const meter of meters) if (!answered.has(JSON.stringify([customer, meter]))) missing.push([customer, meter]);
  }
  return missing;
}
