/** Traces (conformance/README.md §6): replaying what a Python core was given and answered, and
 * checking that this core answers the same. Values are JSON with tags: `{"$kind": <class>, ...}`
 * with the Python field names (snake_case; this core's are camelCase), `{"$bytes": hex}`,
 * `{"$map": [[k, v], ...]}`, `{"$datetime": ISO}`, `{"$float": "nan"|"inf"|"-inf"}`. The
 * conversion is generic over the field names, so a re-recorded trace needs no change here. */

import { Aggregate } from "./aggregate.js";
import { Balance } from "./balance.js";
import { Delivery, type DeliverySettings, type DeliveryInput, makeDeliverySettings } from "./delivery.js";
import type { Effect } from "./effects.js";
import { OutpostError } from "./errors.js";
import type { Input, RawFields } from "./inputs.js";
import { Customer } from "./keys.js";
import { Link, Target } from "./link.js";
import type { Random, RandomBytes } from "./random.js";
import { Session, type Settings, makeSettings } from "./session.js";
import { isoPython } from "./time.js";
import { acceptFor, decodeClientFrames } from "./websocket.js";

export const FORMAT = "outpost-trace";
/** The version recorded. 2: delivery loops recorded as sessions are (input, effects records);
 * replays read 1 too (a delivery loop's poll and outcome records). */
export const VERSION = 2;
const READS = [1, 2];
export type Record_ = Record<string, unknown>;

const snake = (name: string): string => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
const camel = (name: string): string => name.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());
const hex = (bytes: Uint8Array): string => Buffer.from(bytes).toString("hex");
const latin1 = (bytes: Uint8Array): string => Buffer.from(bytes).toString("latin1");

/** This core's value in the trace form. */
export function encode(value: unknown): unknown {
  if (value instanceof Uint8Array) return { $bytes: hex(value) };
  if (value instanceof Customer) return { $kind: "Customer", kind: value.kind, id: value.id };
  if (value instanceof Aggregate) return { $kind: "Aggregate", count: value.count, sum: value.sum, min: value.min, max: value.max };
  if (value instanceof Balance) {
    const out: Record_ = { $kind: "Balance" };
    for (const [name, field] of Object.entries(value)) {
      if (name === "coldUntilUs" || name === "snapshotAsOfUs") {
        out[name === "coldUntilUs" ? "cold_until" : "snapshot_as_of"] = field === null ? null : { $datetime: isoPython(field as number) };
      } else {
        out[snake(name)] = encode(field);
      }
    }
    return out;
  }
  if (typeof value === "number" && !Number.isFinite(value)) {
    return { $float: Number.isNaN(value) ? "nan" : value > 0 ? "inf" : "-inf" };
  }
  if (Array.isArray(value)) return value.map(encode);
  if (value instanceof Map) {
    const entries = [...value.entries()];
    if (entries.every(([k]) => typeof k === "string")) return Object.fromEntries(entries.map(([k, v]) => [k, encode(v)]));
    return { $map: entries.map(([k, v]) => [encode(k), encode(v)]) };
  }
  if (typeof value === "object" && value !== null) {
    const obj = value as Record_;
    if (obj.kind === "SendBytes" && obj.data instanceof Uint8Array) return { $kind: "SendBytes", ...decodeClientBytes(obj.data) };
    if (typeof obj.kind === "string") {
      const out: Record_ = { $kind: obj.kind };
      for (const [name, field] of Object.entries(obj)) if (name !== "kind") out[snake(name)] = encode(field);
      return out;
    }
    return Object.fromEntries(Object.entries(obj).map(([k, v]) => [k, encode(v)]));
  }
  return value === undefined ? null : value;
}

/** A trace value as this core's: tagged objects become `{kind, camelCaseFields}`. */
export function decode(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(decode);
  if (typeof value !== "object" || value === null) return value;
  const obj = value as Record_;
  if ("$bytes" in obj) return new Uint8Array(Buffer.from(obj.$bytes as string, "hex"));
  if ("$datetime" in obj) return obj.$datetime;
  if ("$float" in obj) return obj.$float === "nan" ? Number.NaN : obj.$float === "inf" ? Infinity : -Infinity;
  if ("$map" in obj) return new Map((obj.$map as [unknown, unknown][]).map(([k, v]) => [decode(k), decode(v)]));
  if (typeof obj.$kind === "string") {
    const out: Record_ = { kind: obj.$kind };
    for (const [name, field] of Object.entries(obj)) if (name !== "$kind") out[camel(name)] = decode(field);
    return out;
  }
  return Object.fromEntries(Object.entries(obj).map(([k, v]) => [k, decode(v)]));
}

/** What a client wrote to the WebSocket, decoded (the masks and the handshake key are random). */
function decodeClientBytes(data: Uint8Array): Record_ {
  const text = latin1(data);
  if (!text.startsWith("GET ")) return { frames: decodeClientFrames(data) };
  const end = text.indexOf("\r\n\r\n");
  const lines = text.slice(0, end).split("\r\n");
  const headers = lines
    .slice(1)
    .map((line) => {
      const colon = line.indexOf(":");
      const name = line.slice(0, colon).trim().toLowerCase();
      return [name, name === "authorization" ? "<redacted>" : line.slice(colon + 1).trim()] as [string, string];
    })
    .filter(([name]) => name !== "sec-websocket-key")
    .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0));
  const out: Record_ = { handshake: { request: lines[0], headers } };
  const rest = data.subarray(end + 4);
  if (rest.length) out.frames = decodeClientFrames(rest);
  return out;
}

/** JSON equality as Python's == on decoded JSON: numbers by value, objects by their keys. */
export function same(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a === "number" && typeof b === "number") return Number.isNaN(a) && Number.isNaN(b);
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => same(x, b[i]));
  }
  if (typeof a === "object" && typeof b === "object" && a !== null && b !== null) {
    const ka = Object.keys(a);
    const kb = Object.keys(b);
    return ka.length === kb.length && ka.every((k) => Object.hasOwn(b, k) && same((a as Record_)[k], (b as Record_)[k]));
  }
  return false;
}

export interface Mismatch {
  line: number;
  what: string;
  expected: unknown;
  actual: unknown;
}

function checkHeader(head: Record_, machine: string): void {
  if (head.format !== FORMAT || !READS.includes(head.version as number)) throw new Error(`not an ${FORMAT} v1 or v2 trace`);
  if (head.machine !== machine) throw new Error(`a ${String(head.machine)} trace, not a ${machine} trace`);
}

function settingsOf<T>(encoded: unknown, make: (overrides: Partial<T>) => T): T {
  const { kind: _kind, ...fields } = decode(encoded) as Record_;
  return make(fields as Partial<T>);
}

/** A deterministic byte source for replays (what it draws is never compared). */
export function replayBytes(): RandomBytes {
  let counter = 0;
  return (n) => Uint8Array.from({ length: n }, () => counter++ & 0xff);
}

const KEY_HEADER = /^sec-websocket-key:[ \t]*([^\r\n]+?)[ \t]*\r?$/im;

/** Feed a session trace through a fresh core; return where it answers differently. */
export function replaySession(records: Record_[], rng: (seed: number) => Random): Mismatch[] {
  const [head, ...lines] = records;
  if (head === undefined) throw new Error("an empty trace");
  checkHeader(head, "session");
  const settings = settingsOf<Settings>(head.settings, makeSettings);
  const link = head.server_url ? new Link(Target.of(head.server_url as string), "replay", rng(head.seed as number), replayBytes()) : null;
  const session = new Session(settings, link);
  const mismatches: Mismatch[] = [];
  let nonce: string | null = null;
  lines.forEach((record, index) => {
    const line = index + 2;
    if (record.t === "input") {
      let input = decode(record.input) as Input;
      if (input.kind === "BytesReceived" && nonce !== null) input = { ...input, data: reaccept(input.data, nonce) };
      session.handle(input);
    } else if (record.t === "effects") {
      const effects: Effect[] = session.effects();
      for (const effect of effects) {
        if (effect.kind === "SendBytes" && latin1(effect.data).startsWith("GET ")) {
          nonce = KEY_HEADER.exec(latin1(effect.data))?.[1] ?? nonce;
        }
      }
      const actual = encode(effects);
      if (!same(actual, record.effects)) mismatches.push({ line, what: "effects", expected: record.effects, actual });
    } else if (record.t === "call") {
      const raw = decode(record.args) as Record_;
      const args = Object.fromEntries(Object.entries(raw).map(([k, v]) => [camel(k), v]));
      let got: Record_;
      try {
        got = { result: encode(call(session, record.method as string, args)) };
      } catch (exc) {
        if (!(exc instanceof OutpostError)) throw exc;
        got = { error: [exc.name, exc.message] };
      }
      const wanted: Record_ = {};
      for (const k of ["result", "error"]) if (k in record) wanted[k] = record[k];
      if (!same(got, wanted)) mismatches.push({ line, what: record.method as string, expected: wanted, actual: got });
    }
  });
  return mismatches;
}

function call(session: Session, method: string, args: Record_): unknown {
  const str = (v: unknown): string | null => (v === null || v === undefined ? null : (v as string));
  if (method === "track") {
    return session.track({
      name: args.name,
      externalCustomerId: args.externalCustomerId,
      customerId: args.customerId,
      metadata: args.metadata,
      timestampUs: args.timestampUs as number,
      nowUs: args.nowUs as number,
      eventId: args.eventId as string,
    });
  }
  if (method === "read") return session.read(args.meterId as string, str(args.externalCustomerId), str(args.customerId), Boolean(args.fresh));
  if (method === "script_sent") return session.scriptSent();
  if (method === "read_fetched") {
    return session.readFetched(args.meterId as string, str(args.externalCustomerId), str(args.customerId), args.fields as Map<string, RawFields>);
  }
  throw new Error(`a trace calls ${method}, which this replay does not know`);
}

/** Feed a delivery trace through a fresh Delivery; return where it acts differently. */
export function replayDelivery(records: Record_[], rng: (seed: number) => Random): Mismatch[] {
  const [head, ...lines] = records;
  if (head === undefined) throw new Error("an empty trace");
  checkHeader(head, "delivery");
  const settings = settingsOf<DeliverySettings>(head.settings, makeDeliverySettings);
  const delivery = new Delivery(settings, rng(head.seed as number), (head.started_at as number | undefined) ?? 0);
  const mismatches: Mismatch[] = [];
  let wallUs = 0; // (version 1: a poll dates from the latest outcome's wall clock)
  for (const [index, record] of lines.entries()) {
    if (record.t === "input") delivery.handle(decode(record.input) as DeliveryInput);
    else if (record.t === "outcome") {
      wallUs = record.wall_us as number;
      delivery.handle({ kind: "Tick", now: record.now as number, wallUs });
      delivery.handle(decode(record.outcome) as DeliveryInput);
    } else if (record.t === "effects" || record.t === "poll") {
      if (record.t === "poll") {
        delivery.handle({ kind: "Flushing", on: Boolean(record.flushing) });
        delivery.handle({ kind: "Tick", now: record.now as number, wallUs });
      }
      const recorded = (record.t === "poll" ? [record.action] : record.effects) as unknown[];
      const effects = delivery.effects().map(encode);
      const matches = effects.length === recorded.length && effects.every((effect, i) => same(withoutLaterFields(effect, recorded[i]), recorded[i]));
      if (!matches) {
        mismatches.push({ line: index + 2, what: "effects", expected: recorded, actual: effects });
        break; // the recorded inputs answer the recorded effects, not these
      }
    }
  }
  return mismatches;
}

/** `action` without the fields the recorded one lacks and it holds as null: a field an effect
 * gained after the trace was recorded (PostAndSettle's read), whose null says what the effect
 * said before it existed. */
function withoutLaterFields(action: unknown, recorded: unknown): unknown {
  if (typeof action !== "object" || action === null || Array.isArray(action)) return action;
  if (typeof recorded !== "object" || recorded === null || Array.isArray(recorded)) return action;
  return Object.fromEntries(Object.entries(action).filter(([name, value]) => value !== null || Object.hasOwn(recorded, name)));
}

/** Rewrite a recorded 101 answer for the replay's own random handshake key. */
function reaccept(data: Uint8Array, nonce: string): Uint8Array {
  const text = latin1(data);
  const marker = "sec-websocket-accept:";
  const start = text.toLowerCase().indexOf(marker);
  if (start < 0) return data;
  const end = text.indexOf("\r\n", start);
  const rewritten = `${text.slice(0, start + marker.length)} ${acceptFor(nonce)}${text.slice(end)}`;
  return new Uint8Array(Buffer.from(rewritten, "latin1"));
}

// -- recording --------------------------------------------------------------------------------

export type Sink = (record: Record_) => void;

export function header(machine: "session" | "delivery", kind: string, settings: object, seed: number, extra: Record_): Record_ {
  return { format: FORMAT, version: VERSION, machine, settings: encode({ kind, ...settings }), seed, ...extra };
}

/** Record a machine's inputs and effects to `sink` (in place); `recordsNoEffects`: whether an
 * empty effects() is recorded too. */
function recordMachine<I, E>(
  machine: { handle(input: I): void; effects(): E[] },
  sink: Sink,
  recordsNoEffects: boolean,
): void {
  const handle = machine.handle.bind(machine);
  const effects = machine.effects.bind(machine);
  machine.handle = (input) => {
    sink({ t: "input", input: encode(input) });
    handle(input);
  };
  machine.effects = () => {
    const out = effects();
    if (out.length || recordsNoEffects) sink({ t: "effects", effects: encode(out) });
    return out;
  };
}

/** Record a session's inputs, effects and calls to `sink` (in place: the same object, recorded). */
export function recordSession(session: Session, sink: Sink): Session {
  recordMachine(session, sink, false); // an empty effects() leaves no record
  const track = session.track.bind(session);
  const read = session.read.bind(session);
  const readFetched = session.readFetched.bind(session);
  const scriptSent = session.scriptSent.bind(session);
  const call = <T>(method: string, args: Record_, run: () => T): T => {
    const record: Record_ = { t: "call", method, args: encode(args) };
    try {
      const result = run();
      record.result = encode(result);
      sink(record);
      return result;
    } catch (exc) {
      if (exc instanceof OutpostError) {
        record.error = [exc.name, exc.message];
        sink(record);
      }
      throw exc;
    }
  };
  session.track = (args) =>
    call(
      "track",
      {
        name: args.name,
        external_customer_id: args.externalCustomerId ?? null,
        customer_id: args.customerId ?? null,
        metadata: args.metadata ?? null,
        timestamp_us: args.timestampUs,
        now_us: args.nowUs,
        event_id: args.eventId,
      },
      () => track(args),
    );
  session.read = (meterId, externalCustomerId = null, customerId = null, fresh = false) =>
    call("read", { meter_id: meterId, external_customer_id: externalCustomerId, customer_id: customerId, fresh }, () =>
      read(meterId, externalCustomerId, customerId, fresh),
    );
  session.readFetched = (meterId, externalCustomerId, customerId, fields) =>
    call("read_fetched", { meter_id: meterId, external_customer_id: externalCustomerId, customer_id: customerId, fields }, () =>
      readFetched(meterId, externalCustomerId, customerId, fields),
    );
  session.scriptSent = () => call("script_sent", {}, scriptSent);
  return session;
}

/** Record a delivery loop's inputs and effects to `sink` (in place), as a session's are. */
export function recordDelivery(delivery: Delivery, sink: Sink): Delivery {
  recordMachine(delivery, sink, true);
  return delivery;
}
