/** Exact admission: reservations (holds) and conditional tracks (docs/admission.md; the same
 * calls as outpost_core/_admission.py). A hold is a field "h:<hold id>" = "<units> <expires at µs>"
 * of the customer's state hash: it travels to every instance's copy on the change channel, and
 * the scripts count it while its expiry is after the caller's clock. */

import { formatNumber, parseNumber } from "./aggregate.js";
import type { Reducer } from "./configuration.js";
import { type RunScript, runScript } from "./effects.js";
import { CannotAdmit, InsufficientBalance, UnknownMeter, UnsupportedMeter, UsageError } from "./errors.js";
import { customerOf } from "./event.js";
import { type Customer, channel, customerPrefix, encodeComponent, stateKey } from "./keys.js";
import type { Session } from "./session.js";

/** Aggregations whose consumption adds up, so that holding units of them means something. */
export const ADMITTED = ["count", "sum"];

/** One open reservation: where its field is, and what it holds. */
export interface Hold {
  readonly meterId: string;
  readonly customer: Customer;
  readonly stateKey: string;
  readonly field: string;
  readonly units: number;
  readonly expiresUs: number;
}

/** A script's answer that the available balance did not cover the request. */
export class Refusal {
  constructor(
    readonly meterId: string,
    readonly balance: number,
    readonly held: number,
  ) {}

  error(units: number): InsufficientBalance {
    return new InsufficientBalance(this.meterId, units, this.balance, this.held);
  }
}

/** The refusal a reserve or admit script answered, or null for any other reply. */
export function refusalOf(reply: unknown): Refusal | null {
  const text = typeof reply === "string" ? reply : Buffer.isBuffer(reply) ? reply.toString("utf-8") : null;
  if (text === null || !text.startsWith('{"no":')) return null;
  let parsed: unknown;
  try {
    parsed = (JSON.parse(text) as { no?: unknown }).no;
  } catch {
    return null;
  }
  if (!Array.isArray(parsed) || parsed.length !== 3) return null;
  const [meterId, balance, held] = parsed as unknown[];
  const b = typeof balance === "string" ? parseNumber(balance) : null;
  const h = typeof held === "string" ? parseNumber(held) : null;
  if (typeof meterId !== "string" || b === null || h === null) return null;
  return new Refusal(meterId, b, h);
}

export function checkAdmitted(meterId: string, reducer: Reducer): void {
  const func = reducer.aggregation.func;
  if (!ADMITTED.includes(func)) {
    throw new UnsupportedMeter(
      `meter '${meterId}' aggregates with '${func}': holding units of it means nothing (only count and sum meters, whose consumption adds up, admit exactly)`,
    );
  }
}

function admissionReducer(session: Session, meterId: string): Reducer {
  const reducer = session.configuration?.reducerFor(meterId) ?? null;
  if (reducer === null) throw new UnknownMeter(`meter '${meterId}' is not in Polar's configuration`);
  checkAdmitted(meterId, reducer);
  return reducer;
}

function names(session: Session, customer: Customer, oneSlot: boolean): readonly Customer[] {
  const aliases = session.remote?.aliases.get(customer.tag) ?? [];
  if (oneSlot && aliases.some((alias) => session.shardOf(alias) !== session.shardOf(customer))) {
    throw new CannotAdmit(`${customer.tag} has other names in other Redis Cluster slots: one script cannot count them all`);
  }
  return aliases;
}

/** Throw UsageError for units or a ttl a reservation cannot take. */
export function checkRequest(units: unknown, ttl: unknown): void {
  if (typeof units !== "number" || !Number.isFinite(units) || units <= 0) throw new UsageError(`units must be a positive, finite number, got ${String(units)}`);
  if (typeof ttl !== "number" || !Number.isFinite(ttl) || ttl <= 0) throw new UsageError(`ttl must be a positive, finite number of seconds, got ${String(ttl)}`);
}

/** The script that holds units of the meter for the customer, and the hold it writes. */
export function reserve(
  session: Session,
  meterId: string,
  units: number,
  externalCustomerId: string | null | undefined,
  customerId: string | null | undefined,
  options: { ttl: number; nowUs: number; holdId: string; oneSlot?: boolean },
): [RunScript, Hold] {
  checkRequest(units, options.ttl);
  const customer = customerOf(externalCustomerId ?? null, customerId ?? null);
  const reducer = admissionReducer(session, meterId);
  const aliases = names(session, customer, options.oneSlot ?? false);
  const state = stateKey(customer, reducer.id, session.shards);
  const ttlUs = Math.max(1, Math.round(options.ttl * 1_000_000));
  const hold: Hold = { meterId, customer, stateKey: state, field: `h:${options.holdId}`, units, expiresUs: options.nowUs + ttlUs };
  const run = runScript(
    "reserve",
    [state, ...aliases.map((alias) => stateKey(alias, reducer.id, session.shards))],
    [
      channel(session.shardOf(customer), session.channelNamespace),
      String(options.nowUs),
      hold.field,
      formatNumber(units),
      String(hold.expiresUs),
      reducer.aggregation.func,
      `c:${meterId}`,
      String(session.knownRev(state)),
    ],
    null,
    [meterId],
  );
  return [run, hold];
}

/** The script that frees a hold (and prunes its hash's expired holds). */
export function release(session: Session, hold: Hold, nowUs: number): RunScript {
  return runScript(
    "release",
    [hold.stateKey],
    [channel(session.shardOf(hold.customer), session.channelNamespace), String(nowUs), hold.field, String(session.knownRev(hold.stateKey))],
    null,
    [hold.meterId],
  );
}

/** track (what Session.track returned for the customer's event) as the admit script: with
 * requireBalance, written only if every meter it counts in covers it; with hold, releasing that
 * hold in the same script (a commit). Also returns what the event asks of each meter checked. */
export function admit(
  session: Session,
  track: RunScript,
  customer: Customer,
  options: { nowUs: number; requireBalance?: boolean; hold?: Hold | null; oneSlot?: boolean },
): [RunScript, Map<string, number>] {
  const reducers = session.configuration?.reducers ?? new Map<string, Reducer>();
  const requireBalance = options.requireBalance ?? false;
  const prefix = `${customerPrefix(customer, session.shards)}:`;
  // Which reducer each identity is: for the checks only (a commit needs none).
  const byKey = requireBalance ? new Map([...reducers.keys()].map((id) => [prefix + encodeComponent(id), id])) : new Map<string, string>();
  const [outbox, ...pairs] = track.keys as [string, ...string[]];
  const states = pairs.filter((_, i) => i % 2 === 0);
  const aliases = requireBalance ? names(session, customer, options.oneSlot ?? false) : [];
  const extra: string[] = [];
  const indexOf = (key: string): number => {
    extra.push(key);
    return 1 + pairs.length + extra.length;
  };
  const identities: string[] = [];
  const asks = new Map<string, number>();
  states.forEach((state, i) => {
    const known = track.args[5 + 2 * i] as string;
    const value = track.args[6 + 2 * i] as string;
    if (!requireBalance) {
      identities.push(known, value, "", "0", "0");
      return;
    }
    const reducer = reducers.get(byKey.get(state) as string) as Reducer;
    for (const meterId of reducer.meterIds) checkAdmitted(meterId, reducer);
    const at = aliases.map((alias) => String(indexOf(stateKey(alias, reducer.id, session.shards))));
    const credits = reducer.meterIds.map((meterId) => `c:${meterId}`);
    const ask = reducer.aggregation.func === "count" ? 1 : Number(value);
    for (const meterId of reducer.meterIds) asks.set(meterId, ask);
    identities.push(known, value, reducer.aggregation.func, String(credits.length), ...credits, String(at.length), ...at);
  });
  let holdArgs = ["", "0", "-1"];
  const hold = options.hold ?? null;
  if (hold !== null) {
    const at = states.includes(hold.stateKey) ? 2 + 2 * states.indexOf(hold.stateKey) : indexOf(hold.stateKey);
    holdArgs = [hold.field, String(at), String(session.knownRev(hold.stateKey))];
  }
  const run = runScript(
    "admit",
    [outbox, ...pairs, ...extra],
    [...track.args.slice(0, 5), String(options.nowUs), String(states.length), ...holdArgs, ...identities],
    null,
    track.meterIds,
    track.buckets,
  );
  return [run, asks];
}
