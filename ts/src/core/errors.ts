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

/** The meter is not in Polar's configuration (or the configuration has not arrived yet). */
export class UnknownMeter extends OutpostError {}

/** The meter's aggregation cannot be reduced into buckets (unique). */
export class UnsupportedMeter extends OutpostError {}

/** The API was misused: wrong arguments, wrong order of calls, or use after close(). */
export class UsageError extends OutpostError {}

/** The instance was closed. */
export class OutpostClosed extends UsageError {}

/** Redis did not answer; nothing was tracked. */
export class RedisUnavailable extends OutpostError {}
