/** Validation of track() input, before anything is written: whatever Polar's ingestion API would
 * refuse with a 422 is refused here with InvalidEvent (its rules: docs/emulator.md). */

import { isObject } from "./aggregate.js";
import { InvalidEvent } from "./errors.js";
import type { EventView } from "./filters.js";
import { Customer } from "./keys.js";
import { repr, reprString, typeName } from "./pyrepr.js";
import { iso } from "./time.js";

export const MAX_NAME = 128;
export const MAX_STRING_VALUE = 500;
export const MAX_EVENT_ID = 256;
/** Outpost's own bound on an external customer id (Polar sets none): every id is held in memory
 * and in Redis keys, so an end user cannot make one megabytes long. */
export const MAX_CUSTOMER_ID = 256;
/** Polar stores `_cost.amount` as a decimal of 17 digits, 12 of them after the point. */
export const COST_MAX_DIGITS = 17;
export const COST_DECIMAL_PLACES = 12;
export const UUID_PATTERN = /^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$/i;
const INT_RANGE = 2 ** 63;

export type Metadata = Record<string, unknown>;

export class TrackedEvent {
  constructor(
    readonly eventId: string,
    readonly name: string,
    readonly customer: Customer,
    readonly timestampUs: number,
    readonly metadata: Metadata,
  ) {}

  view(): EventView {
    const seconds = Math.floor(this.timestampUs / 1_000_000);
    return { name: this.name, timestampS: seconds, metadata: this.metadata, subsecondUs: this.timestampUs - seconds * 1_000_000 };
  }

  /** The event as an item of Polar's POST /v1/events/ingest body. */
  ingestItem(): Record<string, unknown> {
    return {
      name: this.name,
      ...this.customer.wire(),
      external_id: this.eventId,
      timestamp: iso(this.timestampUs),
      metadata: { ...this.metadata },
    };
  }
}

const absent = (value: unknown): boolean => value === null || value === undefined;
const length = (text: string): number => [...text].length;

/** The identity named by exactly one of the two arguments. */
export function customerOf(externalCustomerId: unknown, customerId: unknown): Customer {
  if (absent(externalCustomerId) === absent(customerId)) {
    throw new InvalidEvent("pass exactly one of external_customer_id and customer_id");
  }
  if (!absent(externalCustomerId)) {
    const id = text(externalCustomerId, "external_customer_id");
    if (length(id) > MAX_CUSTOMER_ID) {
      throw new InvalidEvent(`external_customer_id is at most ${MAX_CUSTOMER_ID} characters (${length(id)} given)`);
    }
    return new Customer("external", id);
  }
  const id = text(customerId, "customer_id");
  if (!UUID_PATTERN.test(id)) throw new InvalidEvent(`customer_id must be a Polar customer UUID, got ${reprString(id)}`);
  return new Customer("customer", canonicalUuid(id));
}

/** When the event happened, in µs: nowUs when the caller gave none, else its Date (a Date always
 * names an instant; Python refuses a naive datetime, which JavaScript has no equivalent of). */
export function timestampUsOf(timestamp: unknown, nowUs: number): number {
  if (timestamp === null || timestamp === undefined) return nowUs;
  if (timestamp instanceof Date && !Number.isNaN(timestamp.getTime())) return timestamp.getTime() * 1000;
  throw new InvalidEvent("timestamp must be a timezone-aware datetime");
}

/** The caller's event id, or newId (a fresh one the driver drew) when it gave none. */
export function eventIdOf(eventId: unknown, newId: string): string {
  if (eventId === null || eventId === undefined) return newId;
  if (typeof eventId !== "string") throw new InvalidEvent("event_id must be a string");
  return eventId;
}

/** One spelling per customer: lower case, dashed 8-4-4-4-12. */
export function canonicalUuid(id: string): string {
  const h = id.replaceAll("-", "").toLowerCase();
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

export function buildEvent(args: {
  eventId: string;
  name: unknown;
  customer: Customer;
  metadata: unknown;
  timestampUs: number;
}): TrackedEvent {
  const { eventId, name } = args;
  if (typeof name !== "string" || !name) throw new InvalidEvent(`name must be a non-empty string, got ${repr(name)}`);
  if (length(name) > MAX_NAME) {
    throw new InvalidEvent(`name is at most ${MAX_NAME} characters (${length(name)} given)`);
  }
  storable(name, "name");
  if (!eventId || length(eventId) > MAX_EVENT_ID) {
    throw new InvalidEvent(`event_id must be 1 to ${MAX_EVENT_ID} characters`);
  }
  storable(eventId, "event_id");
  const clean = cleanMetadata(args.metadata);
  return new TrackedEvent(eventId, name, args.customer, args.timestampUs, clean);
}

function text(value: unknown, field: string): string {
  if (typeof value !== "string" || !value) throw new InvalidEvent(`${field} must be a non-empty string, got ${repr(value)}`);
  return storable(value, field);
}

/** value, if UTF-8 can carry it (not a lone surrogate) and Polar stores it (no NUL anywhere). */
function storable(value: string, where: string): string {
  if (!value.isWellFormed()) throw new InvalidEvent(`${where} is not valid Unicode text (a lone surrogate)`);
  if (value.includes("\0")) throw new InvalidEvent(`${where} holds a NUL character, which Polar refuses`);
  return value;
}

function cleanMetadata(metadata: unknown): Metadata {
  if (absent(metadata)) return {};
  if (!isObject(metadata)) throw new InvalidEvent(`metadata must be a mapping, got ${typeName(metadata)}`);
  const clean: Metadata = {};
  for (const [key, value] of Object.entries(metadata)) {
    if (!key) throw new InvalidEvent(`metadata keys must be non-empty strings, got ${reprString(key)}`);
    storable(key, `metadata key ${reprString(key)}`);
    if (key === "_cost") clean[key] = cost(value);
    else if (key === "_llm") clean[key] = llm(value);
    else clean[key] = scalar(value, `metadata[${reprString(key)}]`);
  }
  return clean;
}

function scalar(value: unknown, where: string): string | number | boolean {
  if (typeof value === "boolean") return value;
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new InvalidEvent(`${where} must be a finite number, got ${repr(value)}`);
    // An integral number is written without an exponent below 1e21, and Polar reads such a
    // literal as an integer: refuse one beyond 64 bits, as Python refuses such an int.
    if (Number.isInteger(value) && !(-INT_RANGE <= value && value < INT_RANGE) && Math.abs(value) < 1e21) {
      throw new InvalidEvent(`${where} is out of the 64-bit range`);
    }
    return value;
  }
  if (typeof value === "string") {
    if (!(1 <= length(value) && length(value) <= MAX_STRING_VALUE)) {
      throw new InvalidEvent(`${where} must be 1 to ${MAX_STRING_VALUE} characters`);
    }
    return storable(value, where);
  }
  throw new InvalidEvent(`${where} must be a string, an integer, a float or a boolean, got ${typeName(value)}`);
}

function number(value: unknown, where: string, integer = false): number {
  if (typeof value !== "number") throw new InvalidEvent(`${where} must be a number`);
  if (integer && !Number.isInteger(value)) throw new InvalidEvent(`${where} must be an integer`);
  return scalar(value, where) as number;
}

function object(value: unknown, where: string, required: string[], optional: string[]): Record<string, unknown> {
  if (!isObject(value)) throw new InvalidEvent(`${where} must be an object`);
  const keys = Object.keys(value);
  const missing = required.filter((k) => !keys.includes(k)).sort();
  const unknown = keys.filter((k) => !required.includes(k) && !optional.includes(k)).sort();
  if (missing.length) throw new InvalidEvent(`${where} is missing ${repr(missing)}`);
  if (unknown.length) throw new InvalidEvent(`${where} has unknown fields ${repr(unknown)}`);
  return value;
}

function cost(value: unknown): Metadata {
  const obj = object(value, "metadata['_cost']", ["amount", "currency"], []);
  if (obj.currency !== "usd") throw new InvalidEvent("metadata['_cost'].currency must be 'usd'");
  const where = "metadata['_cost'].amount";
  const amount = number(obj.amount, where);
  if (!decimalFits(amount)) {
    throw new InvalidEvent(
      `${where} must have at most ${COST_MAX_DIGITS} digits, ${COST_DECIMAL_PLACES} of them after the point (Polar's decimal), got ${repr(amount)}`,
    );
  }
  return { amount, currency: "usd" };
}

/** Whether Polar's decimal holds a finite number, read as JSON writes it (its shortest form). */
export function decimalFits(value: number): boolean {
  const [mantissa = "0", exp = "0"] = String(Math.abs(value)).toLowerCase().split("e");
  const [whole = "", fraction = ""] = mantissa.split(".");
  const all = (whole + fraction).replace(/^0+/, "");
  const significant = all.replace(/0+$/, "");
  if (!significant) return true; // zero
  const exponent = Number(exp) - fraction.length + (all.length - significant.length);
  const decimals = Math.max(0, -exponent);
  const digits = exponent >= 0 ? significant.length + exponent : Math.max(significant.length, decimals);
  return digits <= COST_MAX_DIGITS && decimals <= COST_DECIMAL_PLACES;
}

const LLM_INTS = ["input_tokens", "output_tokens", "total_tokens"];

function llm(value: unknown): Metadata {
  const where = "metadata['_llm']";
  const obj = object(value, where, ["vendor", "model", ...LLM_INTS], ["prompt", "response", "cached_input_tokens"]);
  const clean: Metadata = {};
  for (const [field, item] of Object.entries(obj)) {
    if (field === "vendor" || field === "model") clean[field] = textValue(item, `${where}.${field}`);
    else if (field === "prompt" || field === "response") clean[field] = absent(item) ? null : textValue(item, `${where}.${field}`);
    else clean[field] = number(item, `${where}.${field}`, true);
  }
  return clean;
}

function textValue(value: unknown, where: string): string {
  if (typeof value !== "string") throw new InvalidEvent(`${where} must be a string`);
  return storable(value, where);
}
