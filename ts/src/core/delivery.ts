/** Delivery of the outbox to Polar's ingestion API: batching, retries, splitting, settling
 * (outpost_core/_delivery.py; its docstring explains the policy). Each delivery loop owns one
 * Delivery and drives it as the session is driven: handle(Tick) for the time; the one effect
 * effects() drains; do it; handle(Tick), then handle(its answer); log reports(). */

import type { Report } from "./outage.js";
import type { Input } from "./inputs.js";
import { Reports } from "./reports.js";
import { isObject } from "./aggregate.js";
import { backoff } from "./backoff.js";
import { type BudgetAnswered, type TakeRequest, take, waitOf } from "./budget.js";
import { textOf } from "./changes.js";
import { UsageError } from "./errors.js";
import { finite, pyRepr, requirePositive, requireWhole } from "./checks.js";
import { jsonOr } from "./json.js";
import * as liveness from "./liveness.js";
import type { Beat, CheckHeartbeats, ConsumersListed, HeartbeatsChecked, Reclaim, Reclaimed, SurveyConsumers } from "./liveness.js";
import { DEFAULT_SHARDS, ackedKey, allOutboxes, channel } from "./keys.js";
import { checkedShards } from "./shards.js";
import type { Random } from "./random.js";

export const GROUP = "outpost";
/** A loop that lingers for more entries reads again at most this many times before the batch is
 * due (and at least every readBlock), whatever arrives, rather than once per event as a blocking
 * read would (delivery.py). */
const LINGER_READS = 8;
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
  /** The deployment's shard count, as Settings.shards: one outbox stream per shard. */
  shards: number;
  /** Longest a read blocks: a flush waits at most this long to be noticed. */
  readBlock: number;
  /** How long a read blocks while flushing: short, but never zero. */
  flushBlock: number;
  /** This instance's name in the outbox group; empty turns heartbeats and surveys off. */
  consumer: string;
  /** Seconds an instance's heartbeat lives: one silent for that long is dead (liveness.ts). */
  heartbeat: number;
  /** The ingestion requests every instance together may send a minute (budget.ts); 0: no shared
   * budget. */
  requestsPerMinute: number;
  /** Most bytes of one request body: Polar refuses bodies over 10 MiB (413). */
  batchBytes: number;
  /** Settle the batch that ended while the next one is posted (PostAndSettle), rather than before
   * reading on: a loop that settles, then posts, spends the settle scripts' round trips on top of
   * Polar's. The driver turns it on; off, a loop acts as traces recorded before it existed show. */
  settleAlongside: boolean;
  /** Acknowledged entries settle together once this many are held, or as soon as no batch is
   * about to go: fewer, larger settle scripts (each identity's state is written once a script, so
   * once for several batches rather than once for each). 0: each batch settles on its own, as
   * traces recorded before it existed show. */
  settleEvery: number;
  /** Read the entries of the next batch while a batch is posted (PostAndSettle.read), and size each
   * read to about one batch across the streams that hold entries, so that the first post does not
   * wait for a read of everything queued. The driver turns it on; off, a loop acts as traces
   * recorded before it existed show. */
  readAlongside: boolean;
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
    shards: DEFAULT_SHARDS,
    readBlock: 0.5,
    flushBlock: 0.01,
    consumer: "",
    heartbeat: 10.0,
    requestsPerMinute: 0.0,
    batchBytes: 8 * 1024 * 1024,
    settleAlongside: false,
    settleEvery: 0,
    readAlongside: false,
    ...overrides,
  };
  // Refused here, at construction: NaN passes every comparison, and a fraction or an infinity
  // reaches Redis and Polar as a command or header they refuse, in a loop.
  requireWhole("batch_size", s.batchSize, 1, "at least 1");
  requireWhole("max_attempts", s.maxAttempts, 1, "at least 1");
  requireWhole("batch_bytes", s.batchBytes, 1024, "at least 1024");
  requireWhole("settle_every", s.settleEvery, 0, "not negative (0: each batch settles alone)");
  requirePositive("heartbeat", s.heartbeat);
  if (!finite(s.requestsPerMinute) || s.requestsPerMinute < 0) {
    throw new UsageError(`requests_per_minute must be a finite number, not negative (0: no budget), got ${pyRepr(s.requestsPerMinute)}`);
  }
  for (const [name, value] of [
    ["linger", s.linger],
    ["backoff_base", s.backoffBase],
    ["backoff_cap", s.backoffCap],
    ["stall_delay", s.stallDelay],
    ["claim_idle", s.claimIdle],
    ["claim_interval", s.claimInterval],
    ["read_block", s.readBlock],
    ["flush_block", s.flushBlock],
  ] as const) {
    if (!finite(value) || value < 0) throw new UsageError(`${name} must be a finite number, not negative, got ${pyRepr(value)}`);
  }
  checkedShards(s.shards);
  return s;
}

export interface OutboxEntry {
  readonly stream: string;
  readonly id: string;
  /** The event as an item of the ingestion body (JSON), exactly as track() queued it. */
  readonly item: string;
  /** Its size in the body, in bytes. */
  readonly size: number;
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

export interface PostBatch {
  kind: "PostBatch";
  body: Uint8Array;
  size: number;
}

/** XREADGROUP GROUP outpost <consumer> COUNT count BLOCK block STREAMS <all> >... */
export interface ReadOutbox {
  kind: "ReadOutbox";
  count: number;
  block: number;
}

/** Run settles (in order) while post is in flight; report the post's answer once both are done.
 * The scripts settle earlier batches, whose answers came: never this one's. With a read, run it
 * meanwhile too (without blocking), and report PostedAlongside: the post's answer with what the
 * read found. (The loop always sets read, null for none, as a trace records it.) */
export interface PostAndSettle {
  kind: "PostAndSettle";
  post: PostBatch;
  settles: SettleScript[];
  read?: ReadOutbox | null;
}

/** [stream, entry id, fields] as Redis answered. */
export interface OutboxRead {
  kind: "OutboxRead";
  entries: [unknown, unknown, Map<unknown, unknown> | Record<string, unknown>][];
}

export interface BatchAnswered {
  kind: "BatchAnswered";
  status: number;
  body: Uint8Array;
  retryAfter: number | null;
}

/** maybeSent: whether Polar may have received the request (a timeout or reset after sending).
 * stalls: nothing was sent, and no retry changes that until someone fixes the set-up (Polar's
 * TLS certificate does not verify): the loop stalls, as on a 401, and says why. */
export interface BatchFailed {
  kind: "BatchFailed";
  reason: string;
  maybeSent: boolean;
  stalls?: boolean;
}

/** What came of a PostAndSettle with a read: the post's answer, and the entries the read found
 * (none when Redis failed it: they stay queued for a later read). */
export interface PostedAlongside {
  kind: "PostedAlongside";
  answer: BatchAnswered | BatchFailed;
  read: OutboxRead;
}

export type DeliveryEffect =
  | ReadOutbox
  /** XAUTOCLAIM on every outbox stream for entries idle at least minIdle seconds. */
  | { kind: "ClaimStale"; minIdle: number; count: number }
  /** XCLAIM ... JUSTID the entries to this consumer, resetting their idle time. */
  | { kind: "RefreshClaim"; entries: [string, string][] }
  /** POST /v1/events/ingest with body; report BatchAnswered or BatchFailed. */
  | PostBatch
  | SettleScript
  | PostAndSettle
  /** Run settles, in any order or at once (each settles entries of its own); report Settled once
   * all are done. */
  | { kind: "SettleScripts"; settles: SettleScript[] }
  /** Call onDropped(events, reason); report Reported. */
  | { kind: "ReportDropped"; events: unknown[]; reason: string }
  /** Nothing to do before until (monotonic seconds), unless flushing starts. */
  | { kind: "Sleep"; until: number }
  | Beat
  | SurveyConsumers
  | CheckHeartbeats
  | Reclaim
  | TakeRequest;

/** What came of an effect: the input that answers it. */
export type DeliveryAnswer =
  | OutboxRead
  | BatchAnswered
  | BatchFailed
  | PostedAlongside
  | { kind: "Settled"; reply: unknown }
  | { kind: "Reported" }
  /** The previous action (claim refresh, claim, sleep) finished; nothing to report. */
  | { kind: "Done" }
  | ConsumersListed
  | HeartbeatsChecked
  | Reclaimed
  | BudgetAnswered;

/** The time, as the session's Tick: the inputs after it, and the next effect, date from it. */
export type Tick = Extract<Input, { kind: "Tick" }>;
/** A flush began (on) or every flush ended: while one runs, a loop sends what is queued at once
 * rather than linger, and reads with a short block. */
export interface Flushing {
  kind: "Flushing";
  on: boolean;
}

/** Every input a Delivery takes: the time, a flush beginning or ending, the answers to its
 * effects. */
export type DeliveryInput = DeliveryAnswer | Tick | Flushing;

const ANSWERS: Record<DeliveryEffect["kind"], DeliveryAnswer["kind"][]> = {
  ReadOutbox: ["OutboxRead"],
  ClaimStale: ["OutboxRead", "Done"],
  RefreshClaim: ["Done"],
  PostBatch: ["BatchAnswered", "BatchFailed"],
  PostAndSettle: ["BatchAnswered", "BatchFailed", "PostedAlongside"],
  SettleScript: ["Settled"],
  SettleScripts: ["Settled"],
  ReportDropped: ["Reported"],
  Sleep: ["Done"],
  Beat: ["Done"],
  SurveyConsumers: ["ConsumersListed"],
  CheckHeartbeats: ["HeartbeatsChecked"],
  Reclaim: ["Reclaimed"],
  TakeRequest: ["BudgetAnswered"],
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
  /** `stream\nid` of every entry in the buffer or a batch, kept as they come and go: a read
   * checks against it (built for every read, it cost a lingering loop more than the read). */
  private readonly heldKeys = new Set<string>();
  private bufferBytes = 0; // what the buffer adds to a body: each item and a comma
  private readonly budgeted: boolean;
  private grantedAt: number | null = null; // when the request taken from the budget may go
  /** Whether the budget made this request wait: requests are scarce, so it carries all that was
   * read meanwhile (up to batchBytes), not batchSize. */
  private waited = false;
  private bufferSince: number | null = null;
  /** While lingering, no read before this: see LINGER_READS. */
  private nextRead = 0;
  /** Whether the buffer was read once more since a flush began. */
  private toppedUp = false;
  /** Whether the outbox was read (without blocking) since the last batch's settle scripts were
   * queued: once, to find the next batch to post alongside them. */
  private readAhead = false;
  /** How many streams held more entries than the last read took from each: a read asks each
   * stream for its share of a batch (readAlongside). */
  private spread: number;
  private asked: number | null = null; // what the read in flight asked of each stream
  /** Whether the last sized read left entries behind (a stream gave all it was asked): a batch
   * that is not full reads again before it goes, rather than spend a request on a part (a flush
   * of a backlog would otherwise take more requests than it needs). */
  private more = false;
  private readOutstanding = false; // the post in flight carries a read
  private readonly batches: Batch[] = []; // splits waiting their turn, first is current
  private work: DeliveryEffect[] = []; // settle scripts and reports of the batch that ended
  private acked: OutboxEntry[] = []; // acknowledged, to settle together (settleEvery)
  private awaiting: DeliveryEffect["kind"] | null = null;
  private nextClaim: number;
  private readonly live: boolean;
  private nextBeat: number;
  private nextSurvey: number;
  private surveyed = new Map<string, Set<string>>();
  private checking: string[] = [];
  private reclaims: DeliveryEffect[] = [];
  /** Consumers of dead instances this loop removed from the outbox group. */
  consumersRemoved = 0;
  /** Whether a flush runs (the latest Flushing). */
  flushing = false;
  delivered = 0;
  dropped = 0;
  rejectedEntries = 0;
  rateLimited = 0;
  private now: number;
  private wallUs = 0;
  private readonly pendingReports = new Reports();
  /** Why delivery is stalled (a 401/403/404), for operators; null when it is not. */
  stalled: string | null = null;
  /** Stalled by what only an operator fixes (a token, a URL, a certificate, a proxy): the
   * queued events wait stallDelay between tries, and a flush can only time out. */
  blocked = false;

  /** The deployment's outbox streams, and each one's shard. */
  private readonly streams: Map<string, number>;

  constructor(
    readonly settings: DeliverySettings,
    private readonly rng: Random,
    now: number,
  ) {
    this.nextClaim = this.nextBeat = this.nextSurvey = this.now = now;
    this.streams = new Map(allOutboxes(settings.shards).map((stream, shard) => [stream, shard]));
    this.budgeted = settings.requestsPerMinute > 0;
    this.live = Boolean(settings.consumer);
    this.spread = settings.shards;
  }

  // -- what to do -----------------------------------------------------------------------------

  /** Drain what the driver must do now (as of the latest Tick): one effect, a request whose
   * answer handle() takes before the next drain. */
  effects(): DeliveryEffect[] {
    if (this.awaiting !== null) throw new UsageError(`report the outcome of the last action first (${this.awaiting})`);
    const action = this.choose(this.now);
    this.awaiting = action.kind;
    return [action];
  }

  private choose(now: number): DeliveryEffect {
    const s = this.settings;
    if (this.acked.length && (this.acked.length >= s.settleEvery || !this.postingNext(now))) {
      const acked = this.acked;
      this.acked = [];
      this.settle(acked, "acknowledge");
    }
    if (this.work.length) {
      if (s.settleAlongside && this.work.every((w) => w.kind === "SettleScript")) {
        const ahead = this.ahead(now);
        if (ahead !== null) return ahead;
        const settles = this.work as SettleScript[];
        this.work = [];
        this.readAhead = false;
        return { kind: "SettleScripts", settles }; // the next batch cannot go yet: settle now
      }
      return this.work.shift() as DeliveryEffect;
    }
    if (this.live) {
      const action = this.liveness(now);
      if (action !== null) return action;
    }
    const batch = this.batches[0];
    if (batch !== undefined) {
      if (batch.notBefore > now) return { kind: "Sleep", until: batch.notBefore };
      if (!batch.refreshed) {
        // Every entry this loop holds, not only this batch's: the others wait behind it, and an
        // entry left idle past claimIdle would be claimed and posted again.
        batch.refreshed = true;
        return { kind: "RefreshClaim", entries: this.held().map((e) => [e.stream, e.id]) };
      }
      return this.gate(now, false) ?? this.post(batch.entries);
    }
    if (now >= this.nextClaim) {
      this.nextClaim = now + s.claimInterval;
      return { kind: "ClaimStale", minIdle: s.claimIdle, count: s.batchSize };
    }
    if (this.buffer.length) {
      const due = (this.bufferSince as number) + s.linger;
      const ready = this.toppedUp || (now >= due && !this.flushing);
      if (this.full || (ready && !this.more)) return this.gate(now, true) ?? this.nextPost();
      if (this.flushing) this.toppedUp = true; // one read first: a flush sends what is queued in one batch
      else if (now < this.nextRead && !this.more) return { kind: "Sleep", until: Math.min(this.nextRead, due) };
      return this.readOf(s.batchSize - this.buffer.length, 0);
    }
    return this.readOf(s.batchSize, this.flushing ? s.flushBlock : s.readBlock);
  }

  /** A read for `wanted` more entries. Its count bounds each stream: with reads sized
   * (readAlongside), each stream still holding entries is asked for its share. */
  private readOf(wanted: number, block: number): ReadOutbox {
    if (!this.settings.readAlongside) return { kind: "ReadOutbox", count: wanted, block };
    // An eighth more than wanted: streams give unevenly, and a batch a few entries short would
    // take one more read before it goes.
    this.asked = Math.ceil((wanted + Math.floor(wanted / 8)) / this.spread);
    return { kind: "ReadOutbox", count: this.asked, block };
  }

  /** post (with settles), and the read of the next batch's entries meanwhile unless the buffer
   * holds them already (or reads alongside are off). */
  private withRead(post: PostBatch, settles: SettleScript[]): DeliveryEffect {
    const s = this.settings;
    if (!s.readAlongside || this.full) return settles.length ? { kind: "PostAndSettle", post, settles, read: null } : post;
    this.readAhead = true; // the next batch's read is this one
    if (this.flushing) this.toppedUp = true; // a flush posts what this read finds, in one batch
    this.readOutstanding = true;
    return { kind: "PostAndSettle", post, settles, read: this.readOf(s.batchSize - this.buffer.length, 0) };
  }

  private get full(): boolean {
    const s = this.settings;
    return this.buffer.length >= s.batchSize || this.bufferBytes >= s.batchBytes;
  }

  /** With settle scripts queued: the next batch's post, carrying them (they run while it is in
   * flight), or what it needs first without waiting (a read, a request from the budget); null when
   * it cannot go yet: the scripts then run alone, never held back. */
  private ahead(now: number): DeliveryEffect | null {
    const s = this.settings;
    if (this.batches.length) return null; // a split or a retry: its claim is refreshed before it goes again
    if (this.buffer.length) {
      const due = now >= (this.bufferSince as number) + s.linger && !this.flushing;
      if (this.full || ((this.toppedUp || due) && !this.more)) return this.alongside(now);
    }
    if (this.readAhead && !this.more) return null;
    this.readAhead = true;
    if (this.flushing) this.toppedUp = true; // a flush posts what this read finds, in one batch
    return this.readOf(s.batchSize - this.buffer.length, 0);
  }

  /** The next batch with the settle scripts, once the budget lets it go; a request taken from the
   * budget first; null when the budget makes it wait. */
  private alongside(now: number): DeliveryEffect | null {
    const gate = this.gate(now, false);
    if (gate === null) return this.nextPost();
    return gate.kind === "TakeRequest" ? gate : null;
  }

  /** The next batch's post, carrying the settle scripts its turn takes (settlesForOnePost), and
   * the read of the batch after it. */
  private nextPost(): DeliveryEffect {
    const post = this.startBatch();
    const last = !this.buffer.length && !this.more && this.settings.settleAlongside;
    if (last && this.acked.length) {
      // No batch is known to follow this one: what waited to settle with the next batches
      // settles beside it, rather than alone after it (the end of a flush waited for that).
      const acked = this.acked;
      this.acked = [];
      this.settle(acked, "acknowledge");
    }
    const settles = this.settlesForOnePost(last);
    if (settles.length) this.readAhead = false;
    return this.withRead(post, settles);
  }

  /** The queued settle scripts that go beside the next post: every one, or with settleEvery,
   * scripts in order until they settle a batch's worth of entries (one script at least); the
   * others wait for the posts after it. Settling several batches beside one post kept the next
   * post waiting: Redis settles four batches more slowly than Polar stores one. `every`: the post
   * is the last one known, and no post after it would carry the rest. */
  private settlesForOnePost(every: boolean): SettleScript[] {
    const settles = this.work as SettleScript[]; // only settle scripts are queued here
    let taken = settles.length;
    if (this.settings.settleEvery && !every) {
      let entries = 0;
      taken = 0;
      while (taken < settles.length && (taken === 0 || entries < this.settings.batchSize)) {
        entries += Number((settles[taken] as SettleScript).args[3]); // how many entry ids the script settles
        taken += 1;
      }
    }
    this.work = settles.slice(taken);
    return settles.slice(0, taken);
  }

  /** Beat, then survey the group and take what dead instances hold: before any batch, so neither
   * waits behind a batch that waits for Polar. */
  private liveness(now: number): DeliveryEffect | null {
    const s = this.settings;
    if (now >= this.nextBeat) {
      this.nextBeat = now + liveness.interval(s.heartbeat);
      return liveness.beat(s.consumer, s.heartbeat);
    }
    const reclaim = this.reclaims.shift();
    if (reclaim !== undefined) return reclaim;
    if (now >= this.nextSurvey) {
      this.nextSurvey = now + liveness.interval(s.heartbeat);
      return { kind: "SurveyConsumers" };
    }
    return null;
  }

  /** Whether a batch goes next, or once a read fills it: acknowledged entries wait for it (to
   * settle with the next ones) only then, never behind a wait. */
  private postingNext(now: number): boolean {
    const s = this.settings;
    if (this.grantedAt !== null && this.grantedAt > now) return false; // the budget makes the next request wait
    const batch = this.batches[0];
    if (batch !== undefined) return batch.notBefore <= now;
    if (!this.buffer.length) return false;
    const due = now >= (this.bufferSince as number) + s.linger;
    return this.full || this.more || this.toppedUp || this.flushing || due;
  }

  /** Nothing read and not yet settled. */
  get idle(): boolean {
    return !(this.buffer.length || this.batches.length || this.work.length || this.acked.length);
  }

  private held(): OutboxEntry[] {
    return [...this.batches.flatMap((b) => b.entries), ...this.buffer];
  }

  /** null when a request may go now; else take one from the budget, or wait for the one taken
   * (reading more meanwhile, while the batch has room: it grows instead of idling). */
  private gate(now: number, reading: boolean): DeliveryEffect | null {
    if (!this.budgeted) return null;
    if (this.grantedAt === null) return take(this.settings.requestsPerMinute);
    if (now >= this.grantedAt) return null;
    if (reading && this.bufferBytes < this.settings.batchBytes) {
      return this.readOf(this.settings.batchSize, Math.min(this.grantedAt - now, this.settings.readBlock));
    }
    return { kind: "Sleep", until: this.grantedAt };
  }

  private post(entries: OutboxEntry[]): PostBatch {
    this.grantedAt = null;
    return { kind: "PostBatch", body: body(entries), size: entries.length };
  }

  /** A batch of the oldest buffered entries, as many as batchBytes of body holds (and batchSize
   * unless the budget made it wait: requests are only scarce then). */
  private startBatch(): PostBatch {
    this.toppedUp = false;
    let room = this.settings.batchBytes - BODY_OVERHEAD;
    const most = this.waited ? this.buffer.length : this.settings.batchSize;
    let taken = 0;
    for (const entry of this.buffer.slice(0, most)) {
      room -= entry.size + 1;
      if (room < 0 && taken) break;
      taken += 1;
    }
    const entries = this.buffer.slice(0, taken);
    this.buffer = this.buffer.slice(taken);
    this.bufferBytes -= entries.reduce((n, e) => n + e.size + 1, 0);
    if (!this.buffer.length) this.bufferSince = null;
    this.batches.push({ entries, attempts: 0, waits: 0, maybeSent: false, notBefore: 0, refreshed: true });
    return this.post(entries);
  }

  // -- outcomes -------------------------------------------------------------------------------

  /** Take one input: the time (a Tick: now monotonic seconds, which the inputs after it and the
   * next effect date from; wallUs the wall clock, for acknowledgement times, which are compared
   * with snapshot times), a flush beginning or ending, or what came of the effect last drained.
   * Then drain reports() (and effects()). */
  handle(event: DeliveryInput): void {
    if (event.kind === "Tick") {
      this.now = event.now;
      this.wallUs = event.wallUs;
    } else if (event.kind === "Flushing") this.flushing = event.on;
    else this.answeredBy(event);
  }

  private answeredBy(outcome: DeliveryAnswer): void {
    const expected = this.awaiting;
    const now = this.now;
    this.awaiting = null;
    if (expected === null) throw new UsageError(`${outcome.kind} reported with no action outstanding`);
    if (!ANSWERS[expected].includes(outcome.kind)) {
      this.awaiting = expected;
      throw new UsageError(`${outcome.kind} is not a delivery outcome that answers ${expected}`);
    }
    if (expected === "PostAndSettle" && this.readOutstanding !== (outcome.kind === "PostedAlongside")) {
      this.awaiting = expected;
      throw new UsageError(`this PostAndSettle is answered by ${this.readOutstanding ? "a PostedAlongside" : "the post's answer alone"}`);
    }
    this.readOutstanding = false;
    const rejected = this.rejectedEntries;
    this.take(outcome, now);
    const answer = outcome.kind === "PostedAlongside" ? outcome.answer : outcome;
    if (this.rejectedEntries > rejected) {
      const message = `outpost removed ${this.rejectedEntries - rejected} unreadable outbox entries (or rejected replies)`;
      this.pendingReports.add("warning", message);
    }
    const stalls = answer.kind === "BatchFailed" && answer.stalls === true;
    if (this.stalled && (answer.kind === "BatchAnswered" || stalls)) {
      this.pendingReports.add("error", `outpost delivery is stalled: ${this.stalled}`);
    }
  }

  /** Drain what the driver must log (unreadable entries removed, a stall and why), oldest first:
   * at most the newest thousand lines, after one that counts those let go when nobody drained
   * them in time. */
  reports(): Report[] {
    return this.pendingReports.drain();
  }

  private take(outcome: DeliveryAnswer, now: number): void {
    if (outcome.kind === "OutboxRead") this.read(outcome.entries, now);
    else if (outcome.kind === "BatchAnswered") this.answered(outcome, now);
    else if (outcome.kind === "BatchFailed") this.failedBatch(outcome, now);
    else if (outcome.kind === "PostedAlongside") {
      this.take(outcome.answer, now); // the batch posted, then what was read meanwhile
      this.read(outcome.read.entries, now);
    }
    else if (outcome.kind === "ConsumersListed") this.listed(outcome);
    else if (outcome.kind === "HeartbeatsChecked") this.checked(outcome);
    else if (outcome.kind === "Reclaimed") this.reclaimed(outcome, now);
    else if (outcome.kind === "BudgetAnswered") this.budgetAnswered(outcome, now);
  }

  private budgetAnswered(outcome: BudgetAnswered, now: number): void {
    const wait = waitOf(outcome);
    if (wait === null) this.rejectedEntries += 1;
    this.grantedAt = now + (wait ?? 0);
    this.waited = Boolean(wait);
  }

  private listed(outcome: ConsumersListed): void {
    const [surveyed, rejected] = liveness.consumersOf(outcome.listing, this.settings.consumer, this.settings.shards);
    this.surveyed = surveyed;
    this.rejectedEntries += rejected;
    const check = liveness.check(surveyed);
    if (check !== null) {
      this.checking = check[0];
      this.reclaims.push(check[1]);
    }
  }

  private checked(outcome: HeartbeatsChecked): void {
    const s = this.settings;
    const [calls, rejected] = liveness.reclaims(this.surveyed, this.checking, outcome.values, s.consumer, s.batchSize);
    this.rejectedEntries += rejected;
    this.reclaims.push(...calls);
  }

  private reclaimed(outcome: Reclaimed, now: number): void {
    const taken = liveness.takenEntries(outcome);
    if (taken === null) {
      this.rejectedEntries += 1;
      return;
    }
    this.consumersRemoved += taken[1];
    this.read(taken[0], now);
  }

  private read(entries: [unknown, unknown, Map<unknown, unknown> | Record<string, unknown>][], now: number): void {
    const malformed: [string, string][] = [];
    const tooLarge: OutboxEntry[] = [];
    const held = this.heldKeys;
    const taken = new Map<string | null, number>(); // entries each stream answered
    for (const [stream, entryId, fields] of entries) {
      const streamS = textOf(stream);
      taken.set(streamS, (taken.get(streamS) ?? 0) + 1);
      const idS = textOf(entryId);
      const key = `${streamS}\n${idS}`;
      if (held.has(key)) continue; // claimed back while this loop holds it
      const entry = parseEntry(streamS, idS, fields, this.streams);
      if (entry === null) {
        if (streamS !== null && this.streams.has(streamS) && idS !== null) malformed.push([streamS, idS]);
        this.rejectedEntries += 1;
        continue;
      }
      if (BODY_OVERHEAD + entry.size > this.settings.batchBytes) {
        tooLarge.push(entry); // no batch can carry it: Polar would refuse it (413)
        continue;
      }
      if (!this.buffer.length) this.bufferSince = now;
      this.buffer.push(entry);
      this.bufferBytes += entry.size + 1;
      held.add(key);
    }
    this.nextRead = now + Math.min(this.settings.linger / LINGER_READS, this.settings.readBlock);
    if (this.asked !== null) {
      // Streams that gave all that was asked may hold more; when none did, what comes next is
      // new, and the last spread is as good a guess as any.
      const asked = this.asked;
      const filled = [...taken.values()].filter((n) => n >= asked).length;
      this.spread = filled || this.spread;
      this.more = filled > 0;
      this.asked = null;
    }
    if (tooLarge.length) {
      this.drop(tooLarge, `larger than an ingestion request may be (${this.settings.batchBytes} bytes)`, true);
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
      this.blocked = false;
      this.delivered += batch.entries.length;
      if (this.settings.settleEvery) {
        for (const entry of batch.entries) this.acked.push(entry); // held (and so not read again) until settled
      } else this.settle(batch.entries, "acknowledge");
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
      this.blocked = true;
      batch.notBefore = now + this.settings.stallDelay;
      batch.refreshed = false;
    }
  }

  private failedBatch(outcome: { reason: string; maybeSent: boolean; stalls?: boolean }, now: number): void {
    const batch = this.batches[0] as Batch;
    if (outcome.stalls) {
      this.stalled = outcome.reason;
      this.blocked = true;
      batch.notBefore = now + this.settings.stallDelay;
      batch.refreshed = false;
    } else if (outcome.maybeSent) this.retry(batch, outcome.reason, now, null, true);
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
    return settleCall(script, stream, this.streams.get(stream) as number, ids, entries, this.wallUs, this.settings.channelNamespace);
  }

  private backoff(attempt: number): number {
    const s = this.settings;
    return backoff(attempt, s.backoffBase, s.backoffCap, this.rng.random()); // jitter spreads retry storms
  }

  private drop(entries: OutboxEntry[], reason: string, definitive: boolean): void {
    this.dropped += entries.length;
    this.work.push({ kind: "ReportDropped", events: entries.map((e) => eventOf(e.item)), reason });
    this.settle(entries, definitive ? "confirm" : "acknowledge");
  }

  /** Every entry leaves the loop this way: acknowledged, or dropped. */
  private settle(entries: OutboxEntry[], script: string): void {
    for (const entry of entries) this.heldKeys.delete(`${entry.stream}\n${entry.id}`);
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
  shard: number,
  ids: string[],
  entries: readonly OutboxEntry[],
  wallUs: number,
  namespace: string,
): SettleScript {
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
    keys.push(state, ackedKey(state));
    args.push("-1", String(names.length), ...names);
  }
  return { kind: "SettleScript", script, keys, args };
}

/** The outcome a closing instance reports for an action it could not run (Redis failed while it
 * closed): nothing happened, so the work stays queued in Redis for another instance. */
export function nothingDone(action: DeliveryEffect): DeliveryAnswer {
  switch (action.kind) {
    case "ReadOutbox":
    case "ClaimStale":
      return { kind: "OutboxRead", entries: [] };
    case "SurveyConsumers":
      return { kind: "ConsumersListed", listing: [] };
    case "CheckHeartbeats":
      return { kind: "HeartbeatsChecked", values: action.keys.map(() => "1") }; // take nothing
    case "Reclaim":
      return { kind: "Reclaimed", stream: action.stream, reply: '{"e":[],"d":[]}' };
    case "TakeRequest":
      return { kind: "BudgetAnswered", reply: 0 };
    case "SettleScript":
    case "SettleScripts":
      return { kind: "Settled", reply: null };
    case "PostAndSettle":
      if (action.read) {
        const failed: BatchFailed = { kind: "BatchFailed", reason: "the instance closed", maybeSent: true };
        return { kind: "PostedAlongside", answer: failed, read: { kind: "OutboxRead", entries: [] } };
      }
      return { kind: "BatchFailed", reason: "the instance closed", maybeSent: true };
    case "PostBatch":
      return { kind: "BatchFailed", reason: "the instance closed", maybeSent: true };
    default:
      return { kind: "Done" };
  }
}

/** The event of an entry, for onDropped; the raw text if it does not parse. */
function eventOf(item: string): unknown {
  const event = jsonOr(item, null);
  return isObject(event) ? event : { unreadable: item };
}

const BODY_OVERHEAD = '{"events":[]}'.length;

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

const stateLists = new Map<string, readonly string[] | null>();

/** A state-key list as an entry stores it (one per customer and configuration: a few, repeated). */
function statesOf(text: string): readonly string[] | null {
  let states = stateLists.get(text);
  if (states === undefined) {
    const parsed = jsonOr(text, null);
    states = Array.isArray(parsed) && parsed.every((s) => typeof s === "string") ? (parsed as string[]) : null;
    if (stateLists.size >= 4096) stateLists.clear();
    stateLists.set(text, states);
  }
  return states;
}

/** An outbox entry, or null when it is unreadable. The event is kept as track() stored it, to be
 * joined into bodies as it is: not parsed here, only checked to be one JSON object's text (one
 * that is not valid JSON inside gets a 400 or 422 from Polar, which bisection narrows down). */
function parseEntry(
  stream: string | null,
  id: string | null,
  fields: Map<unknown, unknown> | Record<string, unknown>,
  streams: Map<string, number>,
): OutboxEntry | null {
  if (stream === null || !streams.has(stream) || id === null) return null;
  let item: string | null, field: string | null, states: string | null;
  const map = fields instanceof Map ? fields : null;
  const e = map?.get("e");
  const f = map?.get("f");
  const k = map?.get("k");
  if (typeof e === "string" && typeof f === "string" && typeof k === "string") {
    // Text, as the driver reads it: the three fields straight (a read holds hundreds).
    item = e;
    field = f;
    states = k;
  } else {
    const text = new Map<string, string | null>();
    const pairs = fields instanceof Map ? [...fields.entries()] : Object.entries(fields);
    for (const [key, value] of pairs) {
      const name = textOf(key);
      if (name !== null) text.set(name, textOf(value));
    }
    item = text.get("e") ?? null;
    field = text.get("f") ?? null;
    states = text.get("k") ?? null;
  }
  if (item === null || field === null || states === null) return null;
  const stateList = statesOf(states);
  if (stateList === null || !(item.startsWith("{") && item.endsWith("}"))) return null;
  return { stream, id, item, size: Buffer.byteLength(item), field, states: stateList };
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
