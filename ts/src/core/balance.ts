/** The answer to balance(): a meter's balance for one customer, with where it came from. */

import type { Aggregate } from "./aggregate.js";
import type { Customer } from "./keys.js";
import type { IdentityState } from "./mirror.js";
import { PUBLIC_SID } from "./publicAnchoring.js";
import { fromUs } from "./time.js";

export class Balance {
  constructor(
    readonly meterId: string,
    readonly customer: Customer,
    readonly aggregation: string,
    /** credited - consumed. */
    readonly balance: number,
    /** Credited units of the meter, from Polar's latest snapshot. */
    readonly credited: number,
    /** Polar's totals before coldUntil combined with every event Polar has not counted yet. */
    readonly consumed: number,
    /** Polar's own totals, every event before coldUntil. */
    readonly polar: Aggregate,
    /** The events Polar has not counted yet, as tracked into this Redis. */
    readonly local: Aggregate,
    /** How many tracked events Polar has not counted yet. */
    readonly pending: number,
    /** How many of those Polar has not acknowledged yet. */
    readonly undelivered: number,
    /** cold_until of the last snapshot applied, µs since the epoch. */
    readonly coldUntilUs: number | null,
    readonly snapshotAsOfUs: number | null,
    /** The last snapshot applied to this customer's state, by any instance. */
    readonly snapshotId: string | null,
    readonly revision: number,
    /** Where the answer came from: "memory" (a copy following Redis, no network call) or "redis"
     * (one read of the hash: the copy was not following, or fresh). */
    readonly source: "memory" | "redis" = "memory",
    /** The customer's other names (Polar's aliases) whose pending events this balance counts too;
     * polar, local, pending and undelivered then cover every name. */
    readonly aliases: readonly Customer[] = [],
    /** Units held by open reservations (of every instance, under every name of the customer)
     * that have not expired: admitted usage not recorded yet. balance does not subtract them. */
    readonly held: number = 0,
    /** True for an avg or min meter in the public-API mode: Polar's figure relayed as it is, with
     * no bound from local events (an average is not monotone; a minimum over an empty window reads
     * 0), so neither promise of docs/public-mode.md holds for it. */
    readonly approximate: boolean = false,
  ) {}

  /** balance - held: what a reservation or track({ requireBalance: true }) may take. */
  get available(): number {
    return this.balance - this.held;
  }

  /** The same balance, read from Redis. */
  fromRedis(): Balance {
    return new Balance(
      this.meterId,
      this.customer,
      this.aggregation,
      this.balance,
      this.credited,
      this.consumed,
      this.polar,
      this.local,
      this.pending,
      this.undelivered,
      this.coldUntilUs,
      this.snapshotAsOfUs,
      this.snapshotId,
      this.revision,
      "redis",
      this.aliases,
      this.held,
      this.approximate,
    );
  }

  get coldUntil(): Date | null {
    return this.coldUntilUs === null ? null : fromUs(this.coldUntilUs);
  }

  get snapshotAsOf(): Date | null {
    return this.snapshotAsOfUs === null ? null : fromUs(this.snapshotAsOfUs);
  }
}

/** One customer under several names (docs/invariant.md, "One customer, two names"): Polar's
 * totals and credits come from whichever state holds the newest applied snapshot, by
 * (coldUntil, asOf); the pending events of every state count (outpost_core/_balance.py says why
 * none is missed). A state without a snapshot adds its pending events only. */
export function mergedState(own: IdentityState, others: readonly IdentityState[]): IdentityState {
  if (!others.length) return own;
  let newest = own;
  let local = own.local;
  for (const other of others) {
    local = local.merge(other.local);
    if (other.coldUntil !== null && older(newest, other)) newest = other;
  }
  return {
    revision: own.revision,
    coldUntil: newest.coldUntil,
    asOf: newest.asOf,
    snapshotId: newest.snapshotId,
    polar: newest.polar,
    local,
    credits: newest.credits,
    pending: own.pending + others.reduce((n, o) => n + o.pending, 0),
    undelivered: own.undelivered + others.reduce((n, o) => n + o.undelivered, 0),
    problems: [...own.problems, ...others.flatMap((o) => o.problems)],
    holds: [...own.holds, ...others.flatMap((o) => o.holds)],
  };
}

/** Whether a's snapshot is older than b's (the order apply_snapshot keeps). */
function older(a: IdentityState, b: IdentityState): boolean {
  const [ac, aa, bc, ba] = [a.coldUntil ?? 0, a.asOf ?? 0, b.coldUntil ?? 0, b.asOf ?? 0];
  return ac < bc || (ac === bc && aa < ba);
}

export function computeBalance(
  meterId: string,
  customer: Customer,
  aggregation: string,
  state: IdentityState,
  aliases: readonly Customer[] = [],
  nowUs = 0,
): Balance {
  const consumed = state.polar.merge(state.local).quantity(aggregation);
  const credited = state.credits.get(meterId) ?? 0;
  return new Balance(
    meterId,
    customer,
    aggregation,
    credited - consumed,
    credited,
    consumed,
    state.polar,
    state.local,
    state.pending,
    state.undelivered,
    state.coldUntil,
    state.asOf,
    state.snapshotId,
    state.revision,
    "memory",
    aliases,
    heldAt(state, nowUs),
    (aggregation === "avg" || aggregation === "min") && state.snapshotId === PUBLIC_SID,
  );
}

/** The units the state's holds keep from the balance at nowUs (µs). */
export function heldAt(state: IdentityState, nowUs: number): number {
  let held = 0;
  for (const [units, expires] of state.holds) if (expires > nowUs) held += units;
  return held;
}

/** When the first of the state's holds still counted at nowUs expires (null: none). */
export function holdExpiry(state: IdentityState, nowUs: number): number | null {
  let first: number | null = null;
  for (const [, expires] of state.holds) if (expires > nowUs && (first === null || expires < first)) first = expires;
  return first;
}
