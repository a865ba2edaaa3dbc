/** Exact admission for the driver: reservations and conditional tracks (docs/admission.md). What
 * an admission means is decided by core/admission.ts and the scripts; this module runs them the
 * way track() runs its script (its echo is expected, its changes reach the core). */

import { randomUUID } from "node:crypto";
import { type Hold, admit, checkRequest, refusalOf, release, reserve } from "../core/admission.js";
import type { Balance } from "../core/balance.js";
import type { Effect, RunScript } from "../core/effects.js";
import { CannotAdmit, InsufficientBalance, InvalidEvent, NotDurable, NotReady, RedisUnavailable, UnknownMeter, UnsupportedMeter, UsageError } from "../core/errors.js";
import { customerOf } from "../core/event.js";
import type { Session, TrackArgs } from "../core/session.js";
import { type Telemetry, customerAttribute } from "./telemetry.js";
import { trackArgsOf } from "./trackArgs.js";

/** What admission needs of an Outpost instance (Outpost.admissionHooks). */
export interface AdmissionHooks {
  readonly core: Session;
  readonly oneSlot: boolean;
  readonly telemetry: Telemetry;
  ensureStarted(): Promise<void>;
  /** The core's track script (tracking.ts's trackScript: it waits for Polar's configuration first). */
  trackScript(args: TrackArgs): Promise<RunScript>;
  /** Run a script as track() runs its own (tracking.ts's writeScript): `replied` gets its reply and the
   * ticket the core gave it (the core's ScriptReplied must carry it); resolves to why it is less
   * durable than asked (null: it is not). */
  writeScript(run: RunScript, replied: (reply: unknown, ticket: number) => void): Promise<string | null>;
  run(effects: Effect[]): Promise<void>;
  /** What the core asks for now (what it reported meanwhile goes to the log). */
  drain(): Effect[];
  nowUs(): number;
  balance(meterId: string, customer: { externalCustomerId?: string; customerId?: string }): Promise<Balance>;
}

export interface CommitOptions {
  metadata?: Record<string, unknown>;
  timestamp?: Date;
  eventId?: string;
}

/** Units of one meter held for one customer until commit() or release(), or until the hold
 * expires. `await using r = await outpost.reserve(...)` releases it unless committed. */
export class Reservation {
  committed: string | null = null;
  released = false;

  constructor(
    private readonly hooks: AdmissionHooks,
    private readonly hold: Hold,
  ) {}

  get meterId(): string {
    return this.hold.meterId;
  }

  get units(): number {
    return this.hold.units;
  }

  /** When the hold expires (µs since the epoch, the instance's clock). */
  get expiresAtUs(): number {
    return this.hold.expiresUs;
  }

  /** Record the actual event (its value may be more or less than what was held: the usage
   * happened) and release the hold, in one script; resolve to the event's id. After the hold
   * expired, the event is still recorded. */
  async commit(name: string, options: CommitOptions = {}): Promise<string> {
    if (this.committed !== null || this.released) throw new UsageError("this reservation was already committed or released");
    const customer = this.hold.customer;
    this.committed = await trackAdmitted(this.hooks, name, { ...options, ...namesOf(customer) }, false, this.hold);
    return this.committed;
  }

  /** Free the held units now (nothing is recorded). Releasing twice does nothing. */
  async release(): Promise<void> {
    if (this.committed !== null || this.released) return;
    const hold = this.hold;
    await recorded(this.hooks, "release", namesOf(hold.customer), () => [hold.meterId], async () => {
      await runAdmission(this.hooks, release(this.hooks.core, hold, this.hooks.nowUs()));
    });
    this.released = true;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }
}

export function reserveUnits(
  hooks: AdmissionHooks,
  meterId: string,
  units: number,
  options: { externalCustomerId?: string; customerId?: string; ttl?: number },
): Promise<Reservation> {
  return recorded(hooks, "reserve", options, () => [meterId], () => reserveNow(hooks, meterId, units, options));
}

async function reserveNow(
  hooks: AdmissionHooks,
  meterId: string,
  units: number,
  options: { externalCustomerId?: string; customerId?: string; ttl?: number },
): Promise<Reservation> {
  const ttl = options.ttl ?? 60.0;
  checkRequest(units, ttl);
  // The customer's state loaded and Polar's snapshot applied, as for a first read.
  await hooks.balance(meterId, { externalCustomerId: options.externalCustomerId, customerId: options.customerId });
  const [run, hold] = reserve(hooks.core, meterId, units, options.externalCustomerId, options.customerId, {
    ttl,
    nowUs: hooks.nowUs(),
    holdId: randomUUID().replaceAll("-", ""),
    oneSlot: hooks.oneSlot,
  });
  const refusal = await runAdmission(hooks, run);
  if (refusal !== null) throw refusal.error(units);
  return new Reservation(hooks, hold);
}

/** track() through the admit script: with requireBalance, only when every meter the event counts
 * in covers its value; with hold, releasing it (a commit). */
export function trackAdmitted(
  hooks: AdmissionHooks,
  name: string,
  options: CommitOptions & { externalCustomerId?: string; customerId?: string },
  requireBalance: boolean,
  hold: Hold | null = null,
): Promise<string> {
  const meters: string[] = []; // the event's meters, once known
  const operation = hold !== null ? "commit" : "track";
  return recorded(hooks, operation, options, () => meters, () => trackNow(hooks, name, options, requireBalance, hold, meters));
}

async function trackNow(
  hooks: AdmissionHooks,
  name: string,
  options: CommitOptions & { externalCustomerId?: string; customerId?: string },
  requireBalance: boolean,
  hold: Hold | null,
  meters: string[],
): Promise<string> {
  await hooks.ensureStarted();
  const nowUs = hooks.nowUs();
  const args = trackArgsOf(name, options, nowUs);
  const eventId = args.eventId;
  const customer = customerOf(options.externalCustomerId ?? null, options.customerId ?? null);
  const track = await hooks.trackScript(args);
  meters.push(...new Set(track.meterIds));
  if (requireBalance) {
    for (const meterId of new Set(track.meterIds)) {
      await hooks.balance(meterId, { externalCustomerId: options.externalCustomerId, customerId: options.customerId });
    }
  }
  const [run, asks] = admit(hooks.core, track, customer, { nowUs, requireBalance, hold, oneSlot: hooks.oneSlot });
  const refusal = await runAdmission(hooks, run, eventId);
  if (refusal !== null) throw refusal.error(asks.get(refusal.meterId) ?? 0);
  return eventId;
}

/** Run an admission script as track() runs its own: its changes reach the core (its echo is
 * expected), durability "replica" waits for a replica. Returns the refusal the script answered, if
 * it did (nothing written then). `eventId`: the event it records, if it records one. */
async function runAdmission(hooks: AdmissionHooks, run: RunScript, eventId: string | null = null) {
  let refusal = null as ReturnType<typeof refusalOf>; // set by the callback
  const shortfall = await hooks.writeScript(run, (reply, ticket) => {
    refusal = refusalOf(reply);
    // A refusal wrote nothing: the ticket ends all the same (the core applies what it held).
    hooks.core.handle({ kind: "ScriptReplied", reply: refusal === null ? reply : null, tag: null, ticket });
  });
  if (refusal !== null) return refusal;
  const effects = hooks.drain();
  if (effects.length) await hooks.run(effects);
  if (shortfall !== null) {
    const what = eventId === null ? run.script : `event ${eventId} (${run.script})`;
    throw new NotDurable(`${what} is on the primary only: ${shortfall}`, eventId);
  }
  return null;
}

const OUTCOMES: [new (...args: never[]) => Error, string][] = [
  [InsufficientBalance, "insufficient_balance"],
  [CannotAdmit, "cannot_admit"],
  [UnknownMeter, "unknown_meter"],
  [UnsupportedMeter, "unsupported_meter"],
  [InvalidEvent, "invalid"],
  [NotReady, "not_ready"],
  [RedisUnavailable, "redis_error"],
];

/** Run an admission, recording its duration, operation and outcome (as the Python SDK does). */
async function recorded<T>(
  hooks: AdmissionHooks,
  operation: string,
  who: { externalCustomerId?: string; customerId?: string },
  meterIds: () => readonly string[],
  admission: () => Promise<T>,
): Promise<T> {
  const telemetry = hooks.telemetry;
  const started = telemetry.enabled ? performance.now() : 0;
  const done = (outcome: string | null): void => {
    if (!telemetry.enabled || outcome === null) return;
    const customer = customerAttribute(who.externalCustomerId, who.customerId);
    telemetry.admitted(operation, customer, meterIds(), (performance.now() - started) / 1000, outcome);
  };
  try {
    const result = await admission();
    done("ok");
    return result;
  } catch (exc) {
    done(OUTCOMES.find(([kind]) => exc instanceof kind)?.[1] ?? null);
    throw exc;
  }
}

function namesOf(customer: Hold["customer"]): { externalCustomerId?: string; customerId?: string } {
  return customer.kind === "external" ? { externalCustomerId: customer.id } : { customerId: customer.id };
}
