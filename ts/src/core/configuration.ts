/** Polar's configuration: the reducers and the meters they serve. It arrives in the WebSocket
 * `configuration` message and is cached in Redis. */

import { isObject } from "./aggregate.js";
import {
  type Aggregation,
  type EventView,
  type Filter,
  InvalidDefinition,
  parseAggregation,
  parseFilter,
} from "./filters.js";
import { sqlMatches, sqlValue } from "./sqlFilters.js";

export interface Reducer {
  readonly id: string;
  readonly filter: Filter;
  readonly aggregation: Aggregation;
  readonly meterIds: readonly string[];
}

export class Configuration {
  constructor(
    readonly reducers: ReadonlyMap<string, Reducer>,
    /** Meter id → the id of the reducer that serves it. */
    readonly meterReducers: ReadonlyMap<string, string>,
    /** Why some reducers of the payload were left out (each is counted as a rejection). */
    readonly problems: readonly string[] = [],
    readonly organizationId: string | null = null,
  ) {}

  /** [reducer id, value] for every bucketed reducer the event counts in, on the safe side of
   * Polar's two matchings (counted if either counts it): see counts() and safeValue(). */
  contributions(event: EventView): [string, number][] {
    const out: [string, number][] = [];
    for (const reducer of this.reducers.values()) {
      if (!reducer.aggregation.bucketed() || !counts(reducer.filter, event)) continue;
      const value = safeValue(reducer.aggregation, event);
      if (value !== null) out.push([reducer.id, value]);
    }
    return out;
  }

  reducerFor(meterId: string): Reducer | null {
    const reducerId = this.meterReducers.get(meterId);
    return reducerId === undefined ? null : (this.reducers.get(reducerId) ?? null);
  }
}

/** Whether the event counts locally: Polar's Python matching or its SQL matching counts it,
 * whole filter against whole filter (outpost_core/_configuration.py says why). */
export function counts(filter: Filter, event: EventView): boolean {
  return filter.matches(event) || sqlMatches(filter, event);
}

/** The larger of the two dialects' values for a counted event; null: it adds nothing. They differ
 * on timestamp alone, which SQL rounds to the nearest second and Python truncates. */
export function safeValue(aggregation: Aggregation, event: EventView): number | null {
  if (aggregation.property === "timestamp") return sqlValue(aggregation, event);
  const python = aggregation.valueOf(event);
  const sql = sqlValue(aggregation, event);
  // They differ only on a dotted property that metadata also holds as one key.
  if (python === null || sql === null) return sql === null ? python : sql;
  return Math.max(python, sql);
}

/** Parse the configuration payload; a malformed reducer is left out, not fatal. */
export function parseConfiguration(payload: unknown): Configuration {
  if (!isObject(payload) || !Array.isArray(payload.reducers)) {
    throw new InvalidDefinition("configuration payload needs a list of reducers");
  }
  const reducers = new Map<string, Reducer>();
  const meterReducers = new Map<string, string>();
  const problems: string[] = [];
  payload.reducers.forEach((item: unknown, index: number) => {
    let reducer: Reducer;
    try {
      reducer = parseReducer(item);
    } catch (exc) {
      if (!(exc instanceof InvalidDefinition)) throw exc;
      problems.push(`reducer #${index}: ${exc.message}`);
      return;
    }
    reducers.set(reducer.id, reducer);
    for (const meterId of reducer.meterIds) meterReducers.set(meterId, reducer.id);
  });
  const organization = payload.organization_id;
  return new Configuration(
    reducers,
    meterReducers,
    problems,
    typeof organization === "string" ? organization : null,
  );
}

function parseReducer(item: unknown): Reducer {
  if (!isObject(item)) throw new InvalidDefinition("a reducer must be an object");
  const { id, meter_ids: meterIds } = item;
  if (typeof id !== "string" || !id) throw new InvalidDefinition("a reducer needs an id");
  if (!Array.isArray(meterIds) || !meterIds.every((m) => typeof m === "string")) {
    throw new InvalidDefinition("a reducer's meter_ids must be a list of strings");
  }
  return {
    id,
    filter: parseFilter(item.filter),
    aggregation: parseAggregation(item.aggregation),
    meterIds: meterIds as string[],
  };
}
