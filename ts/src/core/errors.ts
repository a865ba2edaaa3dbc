/** Errors raised to the caller. As in the Python SDK, what the caller did wrong raises at once;
 * what a peer did wrong (Redis, Polar, the WebSocket) is a counted, logged rejection instead. */

export class OutpostError extends Error {
  override get name(): string {
    return this.constructor.name;
  }
}

/** track() was given something Polar would refuse; nothing was written. */
export class InvalidEvent extends OutpostError {}

/** A first read got no snapshot from Polar within snapshotTimeout. */
export class NotReady extends OutpostError {}

/** A webhook delivery whose signature does not hold (or whose timestamp is too far from now):
 * answer it 401 and take nothing from it. The message says why, never the secret. */
export class InvalidWebhook extends OutpostError {}

/** The meter is not in Polar's configuration (or the configuration has not arrived yet). */
export class UnknownMeter extends OutpostError {}

/** The meter's aggregation cannot be reduced into buckets (unique). */
export class UnsupportedMeter extends OutpostError {}

/** The API was misused: wrong arguments, wrong order of calls, or use after close(). */
export class UsageError extends OutpostError {}

/** An option the instance was given (or read from the environment) cannot work: a Redis URL
 * of an unknown scheme, a value out of range. */
export class ConfigurationError extends UsageError {}

/** The instance was closed. */
export class OutpostClosed extends UsageError {}

/** Redis did not answer; nothing was tracked. */
export class RedisUnavailable extends OutpostError {}

/** `durability: "replica"`: the primary wrote the event, but no replica acknowledged it within
 * `durabilityTimeout` (a replica that lags, on a busy machine, misses it too). The event counts and
 * will be delivered, unless the primary fails before its replica has it; retrying track() with the
 * same eventId is safe (a retry writes nothing the primary already holds) and waits for the replica
 * again. */
export class NotDurable extends RedisUnavailable {
  constructor(
    message: string,
    /** The event written on the primary only, also when track() made its id up; null for a
     * reservation's hold or release (reserve() again, or release()). */
    readonly eventId: string | null = null,
  ) {
    super(message);
  }
}

/** The customer's available balance (balance - held, over every instance and every name of the
 * customer) did not cover what was asked: nothing was held, nothing was recorded. */
export class InsufficientBalance extends OutpostError {
  constructor(
    readonly meterId: string,
    /** What was asked (a reservation's units; a conditional track's value, 1 for a count). */
    readonly units: number,
    /** credited - consumed as the admission saw it, in Redis. */
    readonly balance: number,
    /** Units held by open reservations as the admission saw them. */
    readonly held: number,
  ) {
    super(`meter '${meterId}': ${units} units asked, ${balance - held} available (balance ${balance}, ${held} held by open reservations)`);
  }

  get available(): number {
    return this.balance - this.held;
  }
}

/** Admission cannot be decided exactly in one script, so it is refused rather than decided on a
 * partial view: on Redis Cluster, a customer whose names (Polar's aliases) live in other slots. */
export class CannotAdmit extends OutpostError {}
