/** The in-memory copy of one identity's state hash, kept in revision order.
 *
 * A change whose revision is the next one applies in place; an older one is ignored; a full state
 * replaces the copy when it is newer; anything else is a gap, and the copy reloads the hash.
 * Changes that arrive while a load is in flight wait for it, then apply in order.
 *
 * Loads are numbered: only the answer to the latest one counts (an older load may have read the
 * hash before changes the copy has since taken). A copy is *following* Redis when the load that
 * installed it was asked while the shard's subscription was confirmed, and the subscription has
 * not broken since: only a following copy may answer a read from memory. */

import { Aggregate, EMPTY, parseNumber } from "./aggregate.js";
import type { Change } from "./changes.js";
import type { Customer } from "./keys.js";
import { reprString } from "./pyrepr.js";

export enum Offer {
  APPLIED = "applied",
  IGNORED = "ignored",
  HELD = "held",
  GAP = "gap",
}

/** What a read needs, derived from the state hash. */
export interface IdentityState {
  readonly revision: number;
  readonly coldUntil: number | null;
  readonly asOf: number | null;
  readonly snapshotId: string | null;
  readonly polar: Aggregate;
  readonly local: Aggregate;
  readonly credits: ReadonlyMap<string, number>;
  readonly pending: number;
  readonly undelivered: number;
  readonly problems: readonly string[];
  /** The open reservations' holds: [units, expires at µs], expired ones included (a read counts
   * those whose expiry is after its clock). */
  readonly holds: readonly (readonly [number, number])[];
}

export class Mirror {
  rev = -1;
  fields = new Map<string, string>();
  loaded = false;
  /** The latest load asked for; answers to older ones are ignored. */
  loadId = 0;
  /** Whether the latest load was asked while the shard's subscription was confirmed. */
  loadFollows = false;
  /** The copy's revision when the latest load was asked. */
  loadRev = -1;
  following = false;
  held: Change[] = [];
  private derived: IdentityState | null = null;
  /** The warm-path keys whose cached balance this copy answers (callers' spellings). */
  readonly readKeys = new Set<string>();
  /** The hash a fresh read last fetched (its text fields, and those refused as not UTF-8 text),
   * and what it derived: the same fields fetched again derive the same state (a fresh read of a
   * hash that did not change costs a comparison), and their refusals were counted. */
  fetched: { text: ReadonlyMap<string, string>; refused: string; state: IdentityState } | null = null;

  constructor(
    readonly key: string,
    readonly customer: Customer,
    readonly reducerId: string,
  ) {}

  offer(change: Change): Offer {
    if (change.set === null) {
      // The script sent no content: a newer revision than the copy's means the copy is behind
      // something this instance wrote: reload rather than serve it without it.
      if (this.loaded && change.rev > this.rev) {
        this.unload();
        return Offer.GAP;
      }
      return Offer.IGNORED;
    }
    if (!this.loaded) {
      this.held.push(change);
      return Offer.HELD;
    }
    if (change.full) {
      if (change.rev <= this.rev) return Offer.IGNORED; // the same revision is the same content
      this.fields = new Map(change.set);
      this.rev = change.rev;
      this.derived = null;
      return Offer.APPLIED;
    }
    if (change.rev <= this.rev) return Offer.IGNORED;
    if (change.rev !== this.rev + 1) {
      this.unload();
      this.held.push(change);
      return Offer.GAP;
    }
    for (const [name, value] of change.set) this.fields.set(name, value);
    for (const name of change.deleted) this.fields.delete(name);
    this.rev = change.rev;
    this.derived = null;
    return Offer.APPLIED;
  }

  /** Forget the copy's currency: it reloads, and changes wait for the load. */
  unload(): void {
    this.loaded = false;
  }

  /** A load is asked for (the copy waits for it); return its number. */
  startLoad(follows: boolean): number {
    this.unload();
    this.loadId += 1;
    this.loadFollows = follows;
    this.loadRev = this.rev;
    return this.loadId;
  }

  /** The subscription broke: changes may be missed from now on. */
  stopFollowing(): void {
    this.following = this.loadFollows = false;
  }

  /** Install the hash that load loadId read, then the held changes; false when a gap remains
   * (load again), null when the load is not the latest (ignored). */
  loadedWith(fields: Map<string, string>, loadId: number): boolean | null {
    if (loadId !== this.loadId) return null;
    const rev = revisionOf(fields.get("rev")) || 0;
    const held = [...this.held].sort((a, b) => a.rev - b.rev);
    this.held = [];
    // A load older than the copy is a second answer to the latest load, come after changes the
    // copy has taken since: keep the copy. A hash older than the copy was when the load was asked
    // has gone back in time (Redis lost writes): the copy follows Redis there.
    if (rev >= this.rev || rev < this.loadRev) {
      this.fields = new Map(fields);
      this.rev = rev;
      this.derived = null;
    }
    this.loaded = true;
    this.following = this.loadFollows;
    for (const change of held) {
      if (this.offer(change) === Offer.GAP) {
        this.held.push(...held.filter((c) => c.rev > change.rev));
        return false;
      }
    }
    return true;
  }

  get state(): IdentityState {
    this.derived ??= deriveState(this.fields, this.rev);
    return this.derived;
  }
}

/** A decimal integer as the scripts write it (ASCII digits, an optional '-', at most 20 digits:
 * any 64-bit integer); null otherwise (a peer's 5,000 digits are garbage, not Infinity). */
export function parseInt10(text: string | undefined): number | null {
  if (text === undefined || !/^-?[0-9]{1,20}$/.test(text)) return null;
  return Number(text);
}

/** A state hash's rev as the scripts write it (0 to 2^53 - 1: past it, neither a Lua number nor
 * a JavaScript one counts by one); null for a peer's garbage. */
export function revisionOf(text: string | undefined): number | null {
  const rev = parseInt10(text);
  return rev !== null && rev >= 0 && Number.isSafeInteger(rev) ? rev : null;
}

/** The last microsecond of year 9999: a later cold_until or as_of is a peer's garbage. */
export const MAX_US = 253_402_300_799_999_999;
const TIMES = new Set(["cu", "sa"]);

/** What a read needs from a state hash (rev defaults to the hash's own). */
export function deriveState(fields: Map<string, string>, rev: number | null = null): IdentityState {
  rev ??= revisionOf(fields.get("rev")) || 0;
  const problems: string[] = [];
  let local = EMPTY;
  const credits = new Map<string, number>();
  let polar = EMPTY;
  const holds: [number, number][] = [];
  for (const [name, text] of fields) {
    if (name.startsWith("h:")) {
      const hold = parseHold(text);
      if (hold === null) problems.push(`${name}=${reprString(text)}`);
      else holds.push(hold);
    } else if (name.startsWith("a:")) {
      const agg = Aggregate.decode(text);
      if (agg === null || parseInt10(name.slice(2)) === null) problems.push(`${name}=${reprString(text)}`);
      else local = local.merge(agg);
    } else if (name.startsWith("c:")) {
      const units = parseNumber(text);
      if (units === null) problems.push(`${name}=${reprString(text)}`);
      else credits.set(name.slice(2), units);
    }
  }
  const p = fields.get("p");
  if (p !== undefined) {
    const parsed = Aggregate.decode(p);
    if (parsed === null) problems.push(`p=${reprString(p)}`);
    else polar = parsed;
  }
  const counters: Record<string, number> = {};
  for (const name of ["rev", "cu", "sa", "n", "u"]) {
    const raw = fields.get(name);
    let value = name === "rev" ? revisionOf(raw) : parseInt10(raw);
    // The scripts write no such time (no Date holds it): a peer's garbage.
    if (TIMES.has(name) && value !== null && (value < 0 || value > MAX_US)) value = null;
    if (raw !== undefined && value === null) problems.push(`${name}=${reprString(raw)}`);
    counters[name] = value ?? -1;
  }
  const cu = counters.cu as number;
  const sa = counters.sa as number;
  return {
    revision: rev,
    coldUntil: cu >= 0 ? cu : null,
    asOf: sa >= 0 ? sa : null,
    snapshotId: fields.get("sid") ?? null,
    polar,
    local,
    credits,
    pending: Math.max(counters.n as number, 0),
    undelivered: Math.max(counters.u as number, 0),
    problems,
    holds,
  };
}

/** The fields of a change that a read could not use, named as deriveState names them in
 * problems. */
export function unreadableFields(pairs: readonly [string, string][]): readonly string[] {
  return deriveState(new Map(pairs), 0).problems;
}

/** A hold's field value as the scripts write it, "<units> <expires at µs>". */
export function parseHold(text: string): [number, number] | null {
  const space = text.indexOf(" ");
  const units = parseNumber(space < 0 ? text : text.slice(0, space));
  const at = space < 0 ? null : parseInt10(text.slice(space + 1));
  if (units === null || at === null || units < 0) return null;
  return [units, at];
}
