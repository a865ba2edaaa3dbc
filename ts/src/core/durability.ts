/** How far an event has got when track() resolves: the opt-in durability setting
 * (outpost_core/_durability.py, the same rules and words).
 *
 * Redis replicates asynchronously: a primary acknowledges a write before any replica has it, and a
 * fail-over in between loses the write. "primary" (the default) resolves once the primary ran the
 * track script. "replica" also waits, on the same connection, for `WAIT <replicas> <ms>`: Redis
 * counts the replicas that acknowledged the connection's writes so far, and a promoted replica
 * holds every event track() resolved for. The driver sends the command; this module decides what
 * the setting asks for and what WAIT's answer means. */

import { UsageError } from "./errors.js";
import { repr } from "./pyrepr.js";

export const PRIMARY = "primary";
export const REPLICA = "replica";
export type DurabilityName = typeof PRIMARY | typeof REPLICA;

/** The command sent after the script, on its connection. */
export type WaitCommand = readonly ["WAIT", number, number];

export class Durability {
  private constructor(
    /** How many replicas must acknowledge an event before track() resolves (0: none). */
    readonly replicas: number,
    /** How long WAIT waits for them. */
    readonly timeoutMs: number,
  ) {}

  /** The setting `durability: name`, `durabilityTimeout: timeout` (seconds). */
  static of(name: unknown, timeout: unknown): Durability {
    if (name !== PRIMARY && name !== REPLICA) {
      throw new UsageError(`durability must be '${PRIMARY}' or '${REPLICA}', got ${repr(name)}`);
    }
    // Not finite: no number of milliseconds WAIT takes (Python's round() refuses it too).
    if (typeof timeout !== "number" || !(timeout > 0) || !Number.isFinite(timeout)) {
      throw new UsageError(`durability_timeout must be a positive number, got ${repr(timeout)}`);
    }
    // WAIT's 0 means "for ever": a timeout under a millisecond waits one.
    return new Durability(name === REPLICA ? 1 : 0, Math.max(1, roundHalfEven(timeout * 1000)));
  }

  /** The command to send after the script, on its connection; null: none. */
  wait(): WaitCommand | null {
    return this.replicas ? ["WAIT", this.replicas, this.timeoutMs] : null;
  }

  /** Why the event is less durable than asked, from WAIT's answer; null if it is not. */
  shortfall(acknowledged: unknown): string | null {
    if (typeof acknowledged !== "number" || !Number.isInteger(acknowledged)) {
      return `WAIT answered ${repr(acknowledged)} instead of a count of replicas`;
    }
    if (acknowledged >= this.replicas) return null;
    return `${acknowledged} of ${this.replicas} replica(s) acknowledged the event within ${this.timeoutMs} ms`;
  }
}

/** Python's round() of a float to an integer: a tie goes to the even neighbour. */
function roundHalfEven(value: number): number {
  const floor = Math.floor(value);
  const rest = value - floor;
  if (rest !== 0.5) return rest > 0.5 ? floor + 1 : floor;
  return floor % 2 === 0 ? floor : floor + 1;
}
