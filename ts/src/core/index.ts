/** Outpost's sans-IO core: the state machine the driver runs. Nothing here opens a socket, starts
 * a timer, reads a clock or draws a random number: time, event ids and randomness come in as
 * data, and what needs I/O goes out as effects. */

export { Aggregate, formatNumber, parseNumber } from "./aggregate.js";
export { Balance } from "./balance.js";
export { Configuration, parseConfiguration, type Reducer } from "./configuration.js";
export { Delivery, makeDeliverySettings, withKnownRevs, retryAfter, GROUP, type Action, type Outcome, type DeliverySettings, type OutboxEntry, type SettleScript } from "./delivery.js";
export type { Effect, RunScript } from "./effects.js";
export { InvalidEvent, NotReady, OutpostClosed, OutpostError, RedisUnavailable, UnknownMeter, UnsupportedMeter, UsageError } from "./errors.js";
export type { Input, RawFields } from "./inputs.js";
export { ALL_CHANNELS, ALL_OUTBOXES, CONFIGURATION_KEY, Customer, allChannels, channel, eventsKey, namespaceOfDatabase, outboxKey, stateKey, encodeComponent, crc32 } from "./keys.js";
export { Link, LinkState, Target, type LinkSettings } from "./link.js";
export type { Observation } from "./observations.js";
export { PythonRandom, type Random, type RandomBytes } from "./random.js";
export { SCRIPT_SHA1, SCRIPT_TEXT } from "./scripts.generated.js";
export { Session, makeSettings, type Logger, type Settings, type TrackArgs } from "./session.js";
export { BUCKET_US, floorBucket, fromUs, toUs, iso } from "./time.js";

export const VERSION = "0.1.0";
