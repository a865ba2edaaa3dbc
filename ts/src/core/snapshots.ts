/** Polar's snapshots: parsing them, and the per-customer flow that applies them
 * (outpost_core/_snapshots.py). A snapshot is applied in three steps, one customer at a time:
 * list the pending events of the customer's identities, ask Polar which of those before
 * cold_until the snapshot counts, then run apply_snapshot with the answer. */

import { Aggregate, isNumber, isObject } from "./aggregate.js";
import { Customer } from "./keys.js";
import { UUID_PATTERN, canonicalUuid } from "./event.js";
import { reprString } from "./pyrepr.js";
import { BUCKET_US } from "./time.js";

export const MAX_IDS_PER_QUESTION = 10_000;

/** A snapshot payload that does not follow docs/protocol.md. */
export class MalformedSnapshot extends Error {}

export interface Snapshot {
  readonly snapshotId: string;
  readonly requestId: string | null;
  readonly customer: Customer;
  readonly asOf: number;
  readonly coldUntil: number;
  readonly reducers: ReadonlyMap<string, Aggregate>;
  readonly credited: ReadonlyMap<string, number>;
  /** The customer's other reference forms (Polar's aliases): events tracked under them are this
   * customer's too. */
  readonly aliases: readonly Customer[];
}

export function newerThan(a: Snapshot, b: Snapshot): boolean {
  return a.coldUntil > b.coldUntil || (a.coldUntil === b.coldUntil && a.asOf > b.asOf);
}

export function parseSnapshot(payload: unknown): Snapshot {
  if (!isObject(payload)) throw new MalformedSnapshot("payload is not an object");
  const { snapshot_id: snapshotId, request_id: requestId } = payload;
  if (typeof snapshotId !== "string" || !snapshotId) throw new MalformedSnapshot("snapshot_id missing");
  if (requestId !== undefined && requestId !== null && typeof requestId !== "string") {
    throw new MalformedSnapshot("request_id is not a string");
  }
  const customer = customerIn(payload);
  const { as_of: asOf, cold_until: coldUntil } = payload;
  for (const [name, value] of [["as_of", asOf], ["cold_until", coldUntil]] as const) {
    if (!Number.isSafeInteger(value) || (value as number) < 0) {
      throw new MalformedSnapshot(`${name} is not a non-negative integer`);
    }
  }
  if ((coldUntil as number) % BUCKET_US) throw new MalformedSnapshot("cold_until is not a bucket boundary");
  const { reducers: rawReducers, credited: rawCredited } = payload;
  if (!isObject(rawReducers) || !isObject(rawCredited)) {
    throw new MalformedSnapshot("reducers and credited must be objects");
  }
  const reducers = new Map<string, Aggregate>();
  for (const [reducerId, obj] of Object.entries(rawReducers)) {
    const aggregate = Aggregate.fromWire(obj);
    if (aggregate === null) throw new MalformedSnapshot(`reducer ${reprString(reducerId)} has no valid aggregate`);
    reducers.set(reducerId, aggregate);
  }
  const credited = new Map<string, number>();
  for (const [meterId, units] of Object.entries(rawCredited)) {
    if (!isNumber(units)) throw new MalformedSnapshot(`credited[${reprString(meterId)}] is not a number`);
    credited.set(meterId, units);
  }
  return {
    snapshotId,
    requestId: (requestId as string | undefined) ?? null,
    customer,
    asOf: asOf as number,
    coldUntil: coldUntil as number,
    reducers,
    credited,
    aliases: aliasesIn(payload.aliases, customer),
  };
}

const ALIAS_KINDS = new Map<string, "external" | "customer">([
  ["external_customer_id", "external"],
  ["customer_id", "customer"],
]);

/** The aliases object: absent is none; each key is a reference form other than the snapshot's
 * own, each value a non-empty string. */
export function aliasesIn(raw: unknown, customer: Customer): Customer[] {
  if (raw === null || raw === undefined) return [];
  if (!isObject(raw)) throw new MalformedSnapshot("aliases is not an object");
  const aliases: Customer[] = [];
  for (const [field, value] of Object.entries(raw)) {
    const kind = ALIAS_KINDS.get(field);
    if (kind === undefined || kind === customer.kind) {
      throw new MalformedSnapshot(`aliases names ${reprString(field)}, not another reference form`);
    }
    if (typeof value !== "string" || !value) throw new MalformedSnapshot(`aliases[${reprString(field)}] is not a non-empty string`);
    if (kind === "customer") {
      if (!UUID_PATTERN.test(value)) throw new MalformedSnapshot(`aliases[${reprString(field)}] is not a customer UUID`);
      aliases.push(new Customer(kind, canonicalUuid(value))); // the spelling track() and balance() key it by
    } else {
      aliases.push(new Customer(kind, value));
    }
  }
  return aliases;
}

export function customerIn(payload: Record<string, unknown>): Customer {
  const external = payload.external_customer_id ?? null;
  const internal = payload.customer_id ?? null;
  if (typeof external === "string" && internal === null) return new Customer("external", external);
  if (typeof internal === "string" && external === null) return new Customer("customer", internal);
  throw new MalformedSnapshot("exactly one of external_customer_id and customer_id must be a string");
}

export enum Step {
  IDLE = "idle",
  /** waiting for the fields of the customer's state hashes (which buckets hold events) */
  BUCKETS = "listing buckets",
  /** waiting for the pending events of the buckets before cold_until */
  LISTING = "listing",
  ASKING = "asking",
  APPLYING = "applying",
}

export class CustomerFlow {
  /** The snapshot request in flight (null once answered, or when none was sent). */
  requestId: string | null = null;
  requestedAt = 0;
  step = Step.IDLE;
  current: Snapshot | null = null;
  waiting: Snapshot | null = null;
  /** Event id → the events-hash fields holding it, for the pending events before cold_until. */
  readonly candidates = new Map<string, string[]>();
  readonly questions = new Set<string>();
  readonly counted = new Set<string>();
  /** Per reducer, per meter: the consumption read before the snapshot in progress. */
  before = new Map<string, Map<string, number>>();
  /** When the current step began: a step that waits too long is given up. */
  since = 0;
  /** The Redis effect (list or apply) the current step waits for. */
  tag: number | null = null;
  /** When to ask for a snapshot again after the flow failed (null: not waiting to). */
  retryAt: number | null = null;
  /** Failures in a row (backoff); reset when a snapshot is applied. */
  failures = 0;
  /** Followed again after the process let it go: reads answer from Redis before the snapshot
   * asked then is applied. */
  rejoined = false;
  /** Applied, and not asked again since the link reconnected (not read recently): its next read
   * asks. */
  dormant = false;
  /** When to ask for a snapshot again if this instance still holds delivered events that no
   * snapshot counted (null: not waiting to). */
  refreshAt: number | null = null;
  /** Made by a snapshot nobody asked for (a customer this instance does not follow): it lives
   * only until that snapshot is applied or given up, and never asks Polar for more. */
  pushed = false;

  constructor(
    readonly customer: Customer,
    /** Whether this instance applied a snapshot of this customer since it started following it. */
    public applied = false,
  ) {}

  /** Take a snapshot; true when it should start now. */
  offer(snapshot: Snapshot): boolean {
    if (this.step === Step.IDLE) {
      this.current = snapshot;
      return true;
    }
    if (this.waiting === null || newerThan(snapshot, this.waiting)) this.waiting = snapshot;
    return false;
  }

  /** The link dropped: whatever was in progress is abandoned (it is asked for again). */
  reset(): void {
    this.step = Step.IDLE;
    this.current = this.waiting = null;
    this.requestId = null;
    this.tag = this.retryAt = null;
    this.candidates.clear();
    this.questions.clear();
    this.counted.clear();
  }

  /** The current snapshot is done; return the next one to start, if any. */
  finish(): Snapshot | null {
    this.step = Step.IDLE;
    this.tag = null;
    this.failures = 0;
    this.candidates.clear();
    this.questions.clear();
    this.counted.clear();
    this.current = this.waiting;
    this.waiting = null;
    return this.current;
  }
}
