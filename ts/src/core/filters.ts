/** Meter filters and aggregations with Polar's server-side Python semantics (its rollup's),
 * as outpost_core/_filters.py: the same rules, with Python's comparison rules written out, since
 * JavaScript's differ (`true == 1` holds in both; `"a" > 1` raises in Python and does not match). */

import { isObject } from "./aggregate.js";
import { repr, reprString, str } from "./pyrepr.js";

export const OPERATORS = ["eq", "ne", "gt", "gte", "lt", "lte"] as const;
const LIKE = ["like", "not_like"];
const INT32: [number, number] = [-(2 ** 31), 2 ** 31 - 1];
export const COLUMNS = ["name", "source", "timestamp"];
export const BUCKETED_FUNCS = ["count", "sum", "avg", "min", "max"];
const ALL_FUNCS = [...BUCKETED_FUNCS, "unique"];

/** A filter or aggregation from Polar that does not follow Polar's schema. */
export class InvalidDefinition extends Error {}

/** What a filter can look at: the event's columns and its metadata. */
export interface EventView {
  name: string;
  timestampS: number;
  metadata: Record<string, unknown>;
  source?: string;
  /** Microseconds past timestampS: Polar's SQL rounds to the nearest second instead. */
  subsecondUs?: number;
}

/** Python's three-way comparison of two values; null when Python refuses to order them. */
function compare(a: unknown, b: unknown): number | null {
  const numeric = (v: unknown): number | null =>
    typeof v === "number" ? v : typeof v === "boolean" ? Number(v) : null;
  const x = numeric(a);
  const y = numeric(b);
  if (x !== null && y !== null) return x < y ? -1 : x > y ? 1 : 0;
  if (typeof a === "string" && typeof b === "string") return compareCodePoints(a, b);
  return null;
}

/** Python orders strings by code point; JavaScript's < by UTF-16 code unit. */
function compareCodePoints(a: string, b: string): number {
  const left = [...a];
  const right = [...b];
  for (let i = 0; i < Math.min(left.length, right.length); i++) {
    const x = (left[i] as string).codePointAt(0) as number;
    const y = (right[i] as string).codePointAt(0) as number;
    if (x !== y) return x < y ? -1 : 1;
  }
  return left.length - right.length;
}

export function operate(op: string, actual: unknown, value: unknown): boolean {
  const order = compare(actual, value);
  switch (op) {
    case "eq":
      return order === 0;
    case "ne":
      return order !== 0;
    case "gt":
      return order !== null && order > 0;
    case "gte":
      return order !== null && order >= 0;
    case "lt":
      return order !== null && order < 0;
    default:
      return order !== null && order <= 0; // lte
  }
}

export class Clause {
  constructor(
    readonly property: string,
    readonly operator: string,
    readonly value: string | number | boolean,
  ) {}

  matches(event: EventView): boolean {
    let actual: unknown;
    if (this.property === "name" || this.property === "source") {
      if (typeof this.value !== "string") return false;
      actual = this.property === "name" ? event.name : (event.source ?? "user");
    } else if (this.property === "timestamp") {
      if (typeof this.value === "string") return false; // a bool passes, as in Polar: True is the int 1
      actual = event.timestampS;
    } else {
      actual = lookup(event.metadata, this.property);
      if (actual === null || actual === undefined) return false;
    }
    if (LIKE.includes(this.operator)) {
      const found = str(actual).includes(str(this.value));
      return this.operator === "like" ? found : !found;
    }
    return operate(this.operator, actual, this.value);
  }
}

export class Filter {
  constructor(
    readonly conjunction: string,
    readonly clauses: readonly (Clause | Filter)[],
  ) {}

  matches(event: EventView): boolean {
    if (this.clauses.length === 0) return true;
    if (this.conjunction === "and") return this.clauses.every((c) => c.matches(event));
    return this.clauses.some((c) => c.matches(event));
  }
}

export class Aggregation {
  constructor(
    readonly func: string,
    readonly property: string | null = null,
  ) {}

  /** Whether buckets of count, sum, min and max can produce this aggregation. */
  bucketed(): boolean {
    return BUCKETED_FUNCS.includes(this.func);
  }

  /** The event's contribution, or null when it contributes nothing. */
  valueOf(event: EventView): number | null {
    if (this.func === "count") return 1;
    const prop = this.property as string;
    if (prop === "timestamp") return event.timestampS;
    if (prop === "name" || prop === "source") return null;
    const value = lookup(event.metadata, prop);
    return typeof value === "number" ? value : null;
  }
}

/** Follow a dot path (`_llm.total_tokens`) into metadata; undefined when absent. */
export function lookup(metadata: Record<string, unknown>, path: string): unknown {
  let current: unknown = metadata;
  for (const part of path.split(".")) {
    if (!isObject(current) || !Object.hasOwn(current, part)) return undefined;
    current = current[part];
  }
  return current;
}

function strip(prop: string): string {
  return prop.startsWith("metadata.") ? prop.slice("metadata.".length) : prop;
}

const reprAny = repr;

/** Build a filter from Polar's JSON, refusing what Polar's schema refuses. */
export function parseFilter(obj: unknown, depth = 0): Filter {
  if (depth > 32) throw new InvalidDefinition("filter nested more than 32 levels");
  if (!isObject(obj)) throw new InvalidDefinition("a filter must be an object");
  const conjunction = obj.conjunction;
  if (conjunction !== "and" && conjunction !== "or") {
    throw new InvalidDefinition(`unknown conjunction ${reprAny(conjunction)}`);
  }
  const raw = obj.clauses;
  if (!Array.isArray(raw)) throw new InvalidDefinition("a filter's clauses must be a list");
  const clauses = raw.map((item: unknown) =>
    isObject(item) && "conjunction" in item ? parseFilter(item, depth + 1) : parseClause(item),
  );
  return new Filter(conjunction, clauses);
}

function parseClause(obj: unknown): Clause {
  if (!isObject(obj)) throw new InvalidDefinition("a clause must be an object");
  const { property: prop, operator: op, value } = obj;
  if (typeof prop !== "string" || !prop) throw new InvalidDefinition("a clause needs a property");
  if (typeof op !== "string" || (!(OPERATORS as readonly string[]).includes(op) && !LIKE.includes(op))) {
    throw new InvalidDefinition(`unknown operator ${reprAny(op)}`);
  }
  if (typeof value === "string") {
    if ([...value].length > 1000) throw new InvalidDefinition("a clause value is at most 1000 characters");
  } else if (typeof value === "number") {
    if (!Number.isInteger(value)) {
      throw new InvalidDefinition("a clause value is a string, a 32-bit integer or a boolean");
    }
    if (value < INT32[0] || value > INT32[1]) {
      throw new InvalidDefinition("an integer clause value must fit in 32 bits");
    }
  } else if (typeof value !== "boolean") {
    throw new InvalidDefinition("a clause value is a string, a 32-bit integer or a boolean");
  }
  return new Clause(strip(prop), op, value);
}

export function parseAggregation(obj: unknown): Aggregation {
  if (!isObject(obj)) throw new InvalidDefinition("an aggregation must be an object");
  const func = obj.func;
  if (typeof func !== "string" || !ALL_FUNCS.includes(func)) {
    throw new InvalidDefinition(`unknown aggregation ${reprAny(func)}`);
  }
  if (func === "count") return new Aggregation("count");
  const prop = obj.property;
  if (typeof prop !== "string" || !prop) {
    throw new InvalidDefinition(`aggregation ${reprString(func)} needs a property`);
  }
  return new Aggregation(func, strip(prop));
}
