/** The answer to balance(): a meter's balance for one customer, with where it came from. */

import type { Aggregate } from "./aggregate.js";
import type { Customer } from "./keys.js";
import type { IdentityState } from "./mirror.js";
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
  ) {}

  get coldUntil(): Date | null {
    return this.coldUntilUs === null ? null : fromUs(this.coldUntilUs);
  }

  get snapshotAsOf(): Date | null {
    return this.snapshotAsOfUs === null ? null : fromUs(this.snapshotAsOfUs);
  }
}

export function computeBalance(meterId: string, customer: Customer, aggregation: string, state: IdentityState): Balance {
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
  );
}
