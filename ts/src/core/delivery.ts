/** Delivery of the outbox to Polar's ingestion API: batching, retries, splitting, settling
 * (outpost_core/_delivery.py; its docstring explains the policy). Each delivery loop owns one
 * Delivery and repeats: action = poll(now); do it; handle(outcome, now, wallUs). */

import { isObject } from "./aggregate.js";
import { textOf } from "./changes.js";
import { UsageError } from "./errors.js";
import { ALL_OUTBOXES, channel, eventsKey } from "./keys.js";
import type { Random } from "./random.js";

export const GROUP = "outpost";
const SHARD_OF_STREAM = new Map(ALL_OUTBOXES.map((stream, shard) => [stream, shard]));
const UTF8 = new TextEncoder();

export interface DeliverySettings {
  batchSize: number;
  linger: number;
  maxAttempts: number;
  backoffBase: number;
  backoffCap: number;
  stallDelay: number;
  claimIdle: number;
  claimInterval: number;
  /** Appended to the change channels, as Settings.channelNamespace. */
  channelNamespace: string;
  /** Longest a read blocks: a flush waits at most this long to be noticed. */
  readBlock: number;
  /** How long a read blocks while flushing: short, but never zero. */
  flushBlock: number;
}

export function makeDeliverySettings(overrides: Partial<DeliverySettings> = {}): DeliverySettings {
  const s: DeliverySettings = {
    batchSize: 500,
    linger: 0.2,
    maxAttempts: 10,
    backoffBase: 0.5,
    backoffCap: 60.0,
    stallDelay: 30.0,
    claimIdle: 300.0,
    claimInterval: 30.0,
    channelNamespace: "",
    readBlock: 0.5,
    flushBlock: 0.01,
    ...overrides,
  };
  if (s.batchSize < 1 || s.maxAttempts < 1) throw new UsageError("batch_size and max_attempts must be at least 1");
  if (Math.min(s.linger, s.backoffBase, s.claimIdle, s.readBlock) < 0) throw new UsageError("delivery delays must not be negative");
  return s;
}

export interface OutboxEntry {
  readonly stream: string;
  readonly id: string;
  /** The event as an item of the ingestion body (JSON), exactly as track() queued it. */
  readonly item: string;
  /** Its events-hash field, <bucket>:<event id>. */
  readonly field: string;
  /** The state keys of the identities it counts in. */
  readonly states: readonly string[];
}

export interface SettleScript {
  kind: "SettleScript";
  script: string;
  keys: string[];
  args: string[];
}

export type Action =
  /** XREADGROUP GROUP outpost <consumer> COUNT count BLOCK block STREAMS <all> >... */
  | { kind: "ReadOutbox"; count: number; block: number }
  /** XAUTOCLAIM on every outbox stream for entries idle at least minIdle seconds. */
  | { kind: "ClaimStale"; minIdle: number; count: number }
  /** XCLAIM ... JUSTID the entries to this consumer, resetting their idle time. */
  | { kind: "RefreshClaim"; entries: [string, string][] }
  /** POST /v1/events/ingest with body; report BatchAnswered or BatchFailed. */
  | { kind: "PostBatch"; body: Uint8Array; size: number }
  | SettleScript
  /** Call onDropped(events, reason); report Reported. */
  | { kind: "ReportDropped"; events: unknown[]; reason: string }
  /** Nothing to do before until (monotonic seconds), unless flushing starts. */
  | { kind: "Sleep"; until: number };

export type Outcome =
  /** [stream, entry id, fields] as Redis answered. */
  | { kind: "OutboxRead"; entries: [unknown, unknown, Map<unknown, unknown> | Record<string, unknown>][] }
  | { kind: "BatchAnswered"; status: number; body: Uint8Array; retryAfter: number | null }
  /** maybeSent: whether Polar may have received the request (a timeout or reset after sending). */
  | { kind: "BatchFailed"; reason: string; maybeSent: boolean }
  | { kind: "Settled"; reply: unknown }
  | { kind: "Reported" }
  /** The previous action (claim refresh, claim, sleep) finished; nothing to report. */
  | { kind: "Done" };

const ANSWERS: Record<Action["kind"], Outcome["kind"][]> = {
  ReadOutbox: ["OutboxRead"],
  ClaimStale: ["OutboxRead", "Done"],
  RefreshClaim: ["Done"],
  PostBatch: ["BatchAnswered", "BatchFailed"],
  SettleScript: ["Settled"],
  ReportDropped: ["Reported"],
  Sleep: ["Done"],
};

/** Longest wait a Retry-After may ask for. */
export const RETRY_AFTER_CAP = 120.0;
/** Polar (or its proxy) is down: wait, without using an attempt. */
export const UNAVAILABLE = [502, 503, 504];

interface Batch {
  entries: OutboxEntry[];
  /** Failed deliveries: Polar received the batch and answered an error, or may have. */
  attempts: number;
  /** Times Polar could not take it (rate limited, unavailable, unreachable). */
  waits: number;
  maybeSent: boolean;
  notBefore: number;
  refreshed: boolean;
}

function split(batch: Batch, entries: OutboxEntry[], now: number): Batch {
  return { entries, attempts: batch.attempts, waits: batch.waits, maybeSent: batch.maybeSent, notBefore: now, refreshed: false };
}

export class Delivery {
  private buffer: OutboxEntry[] = [];
  private bufferSince: number | null = null;
  private readonly batches: Batch[] = []; // splits waiting their turn, first is current
  private readonly work: Action[] = []; // settle scripts and reports of the batch that ended
  private awaiting: Action["kind"] | null = null;
  private nextClaim: number;
  flushing = false;
  delivered = 0;
  dropped = 0;
  rejectedEntries = 0;
  rateLimited = 0;
  private wallUs = 0;
  /** Why delivery is stalled (a 401/403/404), for operators; null when it is not. */
  stalled: string | null = null;

  constructor(
    readonly settings: DeliverySettings,
    private readonly rng: Random,
    now: number,
  ) {
    this.nextClaim = now;
  }

  // -- the loop's questions -------------------------------------------------------------------

  poll(now: number): Action {
    if (this.awaiting !== null) throw new UsageError(`report the outcome of the last action first (${this.awaiting})`);
    const action = this.choose(now);
    this.awaiting = action.kind;
    return action;
  }

  private choose(now: number): Action {
    const s = this.settings;
    const work = this.work.shift();
    if (work !== undefined) return work;
    const batch = this.batches[0];
    if (batch !== undefined) {
      if (batch.notBefore > now) return { kind: "Sleep", until: batch.notBefore };
      if (!batch.refreshed) {
        // Every entry this loop holds, not only this batch's: the others wait behind it, and an
        // entry left idle past claimIdle would be claimed and posted again.
        batch.refreshed = true;
        return { kind: "RefreshClaim", entries: this.held().map((e) => [e.stream, e.id]) };
      }
      return { kind: "PostBatch", body: body(batch.entries), size: batch.entries.length };
    }
    if (now >= this.nextClaim) {
      this.nextClaim = now + s.claimInterval;
      return { kind: "ClaimStale", minIdle: s.claimIdle, count: s.batchSize };
    }
    if (this.buffer.length >= s.batchSize) return this.startBatch();
    if (this.buffer.length) {
      const due = (this.bufferSince as number) + s.linger;
      if (now >= due || this.flushing) return this.startBatch();
      return { kind: "ReadOutbox", count: s.batchSize - this.buffer.length, block: Math.min(due - now, s.readBlock) };
    }
    return { kind: "ReadOutbox", count: s.batchSize, block: this.flushing ? s.flushBlock : s.readBlock };
  }

  /** Nothing read and not yet settled. */
  get idle(): boolean {
    return !(this.buffer.length || this.batches.length || this.work.length);
  }

  private held(): OutboxEntry[] {
    return [...this.batches.flatMap((b) => b.entries), ...this.buffer];
  }

  private startBatch(): Action {
    const size = this.settings.batchSize;
    const entries = this.buffer.slice(0, size);
    this.buffer = this.buffer.slice(size);
    if (!this.buffer.length) this.bufferSince = null;
    this.batches.push({ entries, attempts: 0, waits: 0, maybeSent: false, notBefore: 0, refreshed: true });
    return { kind: "PostBatch", body: body(entries), size: entries.length };
  }

  // -- outcomes -------------------------------------------------------------------------------

  /** Report what came of the last action; now is monotonic seconds, wallUs the wall clock
   * (acknowledgement times are compared with snapshot times). */
  handle(outcome: Outcome, now: number, wallUs: number): void {
    const expected = this.awaiting;
    this.awaiting = null;
    this.wallUs = wallUs;
    if (expected === null) throw new UsageError(`${outcome.kind} reported with no action outstanding`);
    if (!ANSWERS[expected].includes(outcome.kind)) {
      this.awaiting = expected;
      throw new UsageError(`${outcome.kind} is not a delivery outcome that answers ${expected}`);
    }
    if (outcome.kind === "OutboxRead") this.read(outcome.entries, now);
    else if (outcome.kind === "BatchAnswered") this.answered(outcome, now);
    else if (outcome.kind === "BatchFailed") this.failedBatch(outcome.reason, outcome.maybeSent, now);
  }

  private read(entries: [unknown, unknown, Map<unknown, unknown> | Record<string, unknown>][], now: number): void {
    const malformed: [string, string][] = [];
    const held = new Set(this.held().map((e) => `${e.stream}\n${e.id}`));
    for (const [stream, entryId, fields] of entries) {
      const streamS = textOf(stream);
      const idS = textOf(entryId);
      if (held.has(`${streamS}\n${idS}`)) continue; // claimed back while this loop holds it
      const entry = parseEntry(streamS, idS, fields);
      if (entry === null) {
        if (streamS !== null && SHARD_OF_STREAM.has(streamS) && idS !== null) malformed.push([streamS, idS]);
        this.rejectedEntries += 1;
        continue;
      }
      if (!this.buffer.length) this.bufferSince = now;
      this.buffer.push(entry);
    }
    for (const [stream, ids] of byStream(malformed)) this.work.push(this.settleScript("confirm", stream, ids, []));
  }

  private answered(outcome: { status: number; body: Uint8Array; retryAfter: number | null }, now: number): void {
    const batch = this.batches[0] as Batch;
    const status = outcome.status;
    let bad: Set<number>;
    if (status >= 200 && status < 300) {
      this.batches.shift();
      this.stalled = null;
      this.delivered += batch.entries.length;
      this.settle(batch.entries, "acknowledge");
    } else if (status === 422 && onlyEarly(outcome.body)) {
      // Polar's clock is behind this machine's: the events become valid in a moment.
      this.stalled = "Polar refused timestamps in its future: this machine's clock is ahead";
      this.wait(batch, now, null);
    } else if (status === 422 && (bad = badIndexes(outcome.body, batch.entries.length)).size) {
      this.batches.shift();
      const dropped = batch.entries.filter((_, i) => bad.has(i));
      const rest = batch.entries.filter((_, i) => !bad.has(i));
      // An earlier attempt that may have reached Polar keeps the drop uncertain.
      this.drop(dropped, "rejected by Polar (422)", !batch.maybeSent);
      if (rest.length) this.batches.unshift(split(batch, rest, now));
    } else if (status === 400 || status === 413 || status === 422) {
      this.batches.shift();
      if (batch.entries.length === 1) {
        this.drop(batch.entries, `rejected by Polar (${status})`, !batch.maybeSent);
      } else {
        const half = Math.floor(batch.entries.length / 2);
        for (const part of [batch.entries.slice(half), batch.entries.slice(0, half)]) {
          this.batches.unshift(split(batch, part, now));
        }
      }
    } else if (status === 429) {
      this.rateLimited += 1;
      this.wait(batch, now, outcome.retryAfter);
    } else if (UNAVAILABLE.includes(status) || status === 408 || status === 425) {
      this.wait(batch, now, outcome.retryAfter); // 408, 425: it was not processed
    } else if (status >= 500 && status < 600) {
      // Polar may have stored the events before failing: if they end up dropped, they keep
      // counting (acknowledged) rather than leave the local balance above Polar's.
      this.retry(batch, `Polar answered ${status}`, now, outcome.retryAfter, true);
    } else {
      // 401, 403, 404, a redirect, 405...: a token or URL mistake, not the events' fault.
      this.stalled = `Polar answered ${status}: check the access token and server URL`;
      batch.notBefore = now + this.settings.stallDelay;
      batch.refreshed = false;
    }
  }

  private failedBatch(reason: string, maybeSent: boolean, now: number): void {
    const batch = this.batches[0] as Batch;
    if (maybeSent) this.retry(batch, reason, now, null, true);
    else this.wait(batch, now, null); // Polar unreachable: nothing was tried
  }

  /** Polar could not take the batch: wait and try again, as long as it takes (no attempt used). */
  private wait(batch: Batch, now: number, retryAfter: number | null): void {
    batch.waits += 1;
    batch.notBefore = now + Math.max(this.backoff(batch.waits), retryAfter ?? 0);
    batch.refreshed = false;
  }

  private retry(batch: Batch, reason: string, now: number, retryAfter: number | null, maybe: boolean): void {
    batch.attempts += 1;
    batch.maybeSent = batch.maybeSent || maybe;
    if (batch.attempts >= this.settings.maxAttempts) {
      this.batches.shift();
      this.drop(batch.entries, `${reason}, after ${batch.attempts} attempts`, !batch.maybeSent);
      return;
    }
    const delay = this.backoff(batch.attempts + batch.waits);
    batch.notBefore = now + Math.max(delay, retryAfter ?? 0);
    batch.refreshed = false;
  }

  private settleScript(script: string, stream: string, ids: string[], entries: OutboxEntry[]): SettleScript {
    return settleCall(script, stream, ids, entries, this.wallUs, this.settings.channelNamespace);
  }

  private backoff(attempt: number): number {
    const s = this.settings;
    const ceiling = Math.min(s.backoffCap, s.backoffBase * 2.0 ** (attempt - 1));
    return ceiling * (0.5 + 0.5 * this.rng.random()); // jitter spreads retry storms
  }

  private drop(entries: OutboxEntry[], reason: string, definitive: boolean): void {
    this.dropped += entries.length;
    this.work.push({ kind: "ReportDropped", events: entries.map((e) => JSON.parse(e.item) as unknown), reason });
    this.settle(entries, definitive ? "confirm" : "acknowledge");
  }

  private settle(entries: OutboxEntry[], script: string): void {
    const groups = new Map<string, OutboxEntry[]>();
    for (const entry of entries) {
      const group = groups.get(entry.stream) ?? [];
      group.push(entry);
      groups.set(entry.stream, group);
    }
    for (const [stream, group] of groups) {
      this.work.push(this.settleScript(script, stream, group.map((e) => e.id), group));
    }
  }
}

/** The acknowledge/confirm call for entries of one stream. */
export function settleCall(
  script: string,
  stream: string,
  ids: string[],
  entries: readonly OutboxEntry[],
  wallUs: number,
  namespace: string,
): SettleScript {
  const shard = SHARD_OF_STREAM.get(stream) as number;
  const fields = new Map<string, string[]>();
  for (const entry of entries) {
    for (const state of entry.states) {
      const names = fields.get(state) ?? [];
      names.push(entry.field);
      fields.set(state, names);
    }
  }
  const keys = [stream];
  const args = [channel(shard, namespace), GROUP, String(wallUs), String(ids.length), ...ids];
  for (const [state, names] of fields) {
    keys.push(state, eventsKey(state));
    args.push("-1", String(names.length), ...names);
  }
  return { kind: "SettleScript", script, keys, args };
}

/** The same call, telling the script which revision this instance holds of each identity, so
 * that its reply updates this instance's copies at once (known gives -1 for none). */
export function withKnownRevs(action: SettleScript, known: (state: string) => number): SettleScript {
  const args = [...action.args];
  let pos = 4 + Number(args[3]);
  for (let i = 1; i < action.keys.length; i += 2) {
    args[pos] = String(known(action.keys[i] as string));
    pos += 2 + Number(args[pos + 1]);
  }
  return { ...action, args };
}

function byStream(pairs: [string, string][]): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const [stream, id] of pairs) {
    const ids = out.get(stream) ?? [];
    ids.push(id);
    out.set(stream, ids);
  }
  return out;
}

function body(entries: readonly OutboxEntry[]): Uint8Array {
  return UTF8.encode(`{"events":[${entries.map((e) => e.item).join(",")}]}`);
}

function parseEntry(stream: string | null, id: string | null, fields: Map<unknown, unknown> | Record<string, unknown>): OutboxEntry | null {
  if (stream === null || !SHARD_OF_STREAM.has(stream) || id === null) return null;
  const text = new Map<string, string | null>();
  const pairs = fields instanceof Map ? [...fields.entries()] : Object.entries(fields);
  for (const [k, v] of pairs) {
    const key = textOf(k);
    if (key !== null) text.set(key, textOf(v));
  }
  const item = text.get("e") ?? null;
  const field = text.get("f") ?? null;
  const states = text.get("k") ?? null;
  if (item === null || field === null || states === null) return null;
  let event: unknown;
  let stateList: unknown;
  try {
    event = JSON.parse(item);
    stateList = JSON.parse(states);
  } catch {
    return null;
  }
  if (!isObject(event) || !Array.isArray(stateList)) return null;
  if (!stateList.every((s) => typeof s === "string")) return null;
  return { stream, id, item, field, states: stateList as string[] };
}

/** The detail list of an error body; empty if there is none. */
function details(raw: Uint8Array): unknown[] {
  try {
    const parsed: unknown = JSON.parse(new TextDecoder().decode(raw));
    const detail = isObject(parsed) ? parsed.detail : undefined;
    return Array.isArray(detail) ? detail : [];
  } catch {
    return [];
  }
}

/** Whether every error of a 422 is a timestamp Polar finds in its future. */
function onlyEarly(raw: Uint8Array): boolean {
  const detail = details(raw);
  return (
    detail.length > 0 &&
    detail.every(
      (item) =>
        isObject(item) &&
        Array.isArray(item.loc) &&
        item.loc.length > 0 &&
        item.loc[item.loc.length - 1] === "timestamp" &&
        pyStr(item.msg ?? "").includes("must be in the past"),
    )
  );
}

function pyStr(value: unknown): string {
  return typeof value === "string" ? value : JSON.stringify(value) ?? "";
}

/** The events a 422 points at (loc = ["body", "events", i, ...]); empty if unclear. */
function badIndexes(raw: Uint8Array, size: number): Set<number> {
  const detail = details(raw);
  const bad = new Set<number>();
  for (const item of detail) {
    const loc = isObject(item) ? item.loc : undefined;
    if (
      !Array.isArray(loc) ||
      loc.length < 3 ||
      loc[0] !== "body" ||
      loc[1] !== "events" ||
      !Number.isInteger(loc[2]) ||
      !(0 <= loc[2] && loc[2] < size)
    ) {
      return new Set();
    }
    bad.add(loc[2] as number);
  }
  return bad;
}

/** Seconds to wait from a Retry-After header: delta-seconds or an HTTP date. */
export function retryAfter(header: string | null, wallUs: number): number | null {
  if (header === null) return null;
  const text = header.trim();
  if (/^[0-9]+$/.test(text)) return Math.min(Number(text), RETRY_AFTER_CAP);
  if (!/[A-Za-z]{3},? /.test(text)) return null;
  const moment = Date.parse(text);
  if (Number.isNaN(moment)) return null;
  const waited = moment / 1000 - wallUs / 1e6;
  return Math.min(Math.max(0, waited), RETRY_AFTER_CAP);
}
