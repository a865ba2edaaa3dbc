/** Meter filters and aggregations with Polar's SQL semantics (outpost_core/_sql_filters.py, whose
 * docstring lists the rules). Polar's Postgres sync, its customer meters and its billing match
 * events in SQL; its real-time rollup, and filters.ts, in Python. Where the two disagree the core
 * counts an event if either counts it (docs/design.md), so it needs the SQL answer too. */

import { isObject } from "./aggregate.js";
import { type Aggregation, type Clause, type EventView, Filter, lookup, operate } from "./filters.js";
import { reprFloat } from "./pyrepr.js";

const HALF_SECOND_US = 500_000;

/** Whether Polar's SQL keeps the event: an empty `and` or `or` is TRUE. */
export function sqlMatches(filter: Filter, event: EventView): boolean {
  if (!filter.clauses.length) return true;
  const wanted = filter.conjunction === "or"; // the answer that decides the group at once
  for (const item of filter.clauses) {
    const found = item instanceof Filter ? sqlMatches(item, event) : clauseMatches(item, event);
    if (found === wanted) return wanted;
  }
  return !wanted;
}

/** One clause in SQL: TRUE is true; FALSE and NULL are false. */
export function clauseMatches(clause: Clause, event: EventView): boolean {
  const op = clause.operator;
  const value = clause.value;
  if (clause.property === "name" || clause.property === "source") {
    if (typeof value !== "string") return false;
    return compareSql(op, clause.property === "name" ? event.name : (event.source ?? "user"), value);
  }
  if (clause.property === "timestamp") {
    if (typeof value === "string") return false;
    const seconds = sqlEpochSeconds(event);
    // Cast to text, a bool value is 't' / 'f'; against bigint Postgres refuses a boolean.
    if (op === "like" || op === "not_like") return compareSql(op, String(seconds), text(value));
    return typeof value !== "boolean" && compareSql(op, seconds, value);
  }
  const prop = clause.property;
  // Polar's filter SQL has been seen to read a dotted property as one key named with the dot:
  // the clause holds if it holds under either reading.
  if (prop.includes(".") && Object.hasOwn(event.metadata, prop)) {
    if (metadataMatches(op, value, event.metadata[prop])) return true;
  }
  return metadataMatches(op, value, lookup(event.metadata, prop));
}

function metadataMatches(op: Clause["operator"], value: Clause["value"], actual: unknown): boolean {
  if (actual === null || actual === undefined) return false; // a missing key or a JSON null: NULL
  if (op === "like" || op === "not_like") return compareSql(op, jsonbText(actual), text(value));
  if (typeof actual === "string") return compareSql(op, actual, text(value));
  if (typeof actual === "boolean") return typeof value === "boolean" && compareSql(op, actual, value);
  if (typeof actual === "number") return typeof value !== "string" && compareSql(op, actual, Number(value));
  return false; // an object or an array: the CASE has no branch, NULL
}

/** What Polar's SQL adds for a matching event; null: the event is left out. */
export function sqlValue(aggregation: Aggregation, event: EventView): number | null {
  if (aggregation.func === "count") return 1;
  const prop = aggregation.property as string;
  if (prop === "timestamp") return sqlEpochSeconds(event);
  if (prop === "name" || prop === "source") return null;
  const path = lookup(event.metadata, prop);
  const found = typeof path === "number" ? path : null;
  const oneKey = prop.includes(".") ? event.metadata[prop] : undefined; // read as one key
  if (typeof oneKey !== "number") return found;
  return found === null ? oneKey : Math.max(found, oneKey);
}

/** The event's epoch seconds rounded half up, as numeric -> bigint does for t >= 0. */
export function sqlEpochSeconds(event: EventView): number {
  return event.timestampS + ((event.subsecondUs ?? 0) >= HALF_SECOND_US ? 1 : 0);
}

/** The ->> text of a JSON value as Postgres renders it. */
export function jsonbText(value: unknown): string {
  return typeof value === "string" ? value : jsonb(value);
}

function jsonb(value: unknown): string {
  if (value === null || value === undefined) return "null";
  if (typeof value === "boolean") return value ? "true" : "false";
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "number") {
    if (Number.isInteger(value) && Math.abs(value) < 1e21) return String(value === 0 ? 0 : value);
    // numeric: no exponent, no sign on zero
    const text = reprFloat(value);
    return text.includes("e") ? plainDecimal(text) : text;
  }
  if (isObject(value)) {
    // jsonb orders keys by their length in bytes, then bytewise.
    const keys = Object.keys(value).sort((a, b) => {
      const x = Buffer.from(a);
      const y = Buffer.from(b);
      return x.length - y.length || Buffer.compare(x, y);
    });
    return `{${keys.map((k) => `${jsonb(k)}: ${jsonb(value[k])}`).join(", ")}}`;
  }
  if (Array.isArray(value)) return `[${value.map(jsonb).join(", ")}]`;
  return String(value);
}

/** A float's repr with an exponent written out in plain digits, as Decimal's "f" format. */
function plainDecimal(text: string): string {
  const [mantissa, exp] = text.split("e") as [string, string];
  const negative = mantissa.startsWith("-");
  const [whole, fraction = ""] = (negative ? mantissa.slice(1) : mantissa).split(".") as [string, string?];
  const digits = whole + fraction;
  const point = whole.length + Number(exp);
  let out: string;
  if (point <= 0) out = `0.${"0".repeat(-point)}${digits}`;
  else if (point >= digits.length) out = digits + "0".repeat(point - digits.length);
  else out = `${digits.slice(0, point)}.${digits.slice(point)}`;
  return (negative ? "-" : "") + out;
}

function text(value: string | number | boolean): string {
  if (typeof value === "boolean") return value ? "t" : "f";
  return String(value);
}

function compareSql(op: string, actual: unknown, expected: unknown): boolean {
  if (op === "like") return (actual as string).includes(expected as string) || unescapedLike(expected as string, actual as string);
  if (op === "not_like") {
    return !(actual as string).includes(expected as string) || !unescapedLike(expected as string, actual as string);
  }
  return operate(op, actual, expected);
}

const LIKE_SPECIAL = /[%_\\]/;
const patterns = new Map<string, RegExp>();

/** text LIKE '%' || value || '%' with Postgres's default escape character, a backslash. */
function unescapedLike(value: string, text: string): boolean {
  if (!LIKE_SPECIAL.test(value)) return text.includes(value);
  return likePattern(`%${value}%`).test(text);
}

function likePattern(pattern: string): RegExp {
  let regex = patterns.get(pattern);
  if (regex === undefined) {
    const parts: string[] = [];
    const chars = [...pattern];
    for (let i = 0; i < chars.length; i++) {
      const c = chars[i] as string;
      if (c === "\\") {
        // The next character is literal; a value ending in a backslash escapes the closing "%".
        i += 1;
        parts.push(escape(chars[i] ?? ""));
      } else if (c === "%") parts.push("[^]*");
      else if (c === "_") parts.push(".");
      else parts.push(escape(c));
    }
    regex = new RegExp(`^(?:${parts.join("")})$`, "su");
    if (patterns.size >= 256) patterns.clear();
    patterns.set(pattern, regex);
  }
  return regex;
}

function escape(c: string): string {
  return c.replace(/[.*+?^${}()|[\]\\/-]/g, "\\$&");
}
