/** The arguments of the core's track() for an event the application records: what track() and an
 * admission (a commit, a track that requires a balance) both pass. */

import { randomUUID } from "node:crypto";
import { eventIdOf, timestampUsOf } from "../core/event.js";
import type { TrackArgs } from "../core/session.js";

export interface EventOptions {
  externalCustomerId?: string;
  customerId?: string;
  metadata?: Record<string, unknown>;
  timestamp?: Date;
  eventId?: string;
}

/** The event `name` tracked at `nowUs`: its timestamp (now unless given) and its id (a new one
 * unless given), each checked. */
export function trackArgsOf(name: string, options: EventOptions, nowUs: number): TrackArgs {
  const timestampUs = timestampUsOf(options.timestamp, nowUs);
  const eventId = eventIdOf(options.eventId, randomUUID().replaceAll("-", ""));
  return {
    name,
    externalCustomerId: options.externalCustomerId,
    customerId: options.customerId,
    metadata: options.metadata,
    timestampUs,
    nowUs,
    eventId,
  };
}
