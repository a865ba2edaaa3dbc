/** Outpost for TypeScript: a local, exact copy of Polar usage in a Redis you own. */
export { Outpost, DEFAULT_REDIS_URL, DEFAULT_SERVER_URL, type OutpostOptions, type TrackOptions, type ReserveOptions, type CustomerOptions, type Clock, type DroppedCallback } from "./driver/outpost.js";
export { Aggregate, Balance, CannotAdmit, ConfigurationError, Customer, InsufficientBalance, InvalidEvent, InvalidWebhook, NotDurable, NotReady, OutpostClosed, OutpostError, RedisUnavailable, UnknownMeter, UnsupportedMeter, UsageError, VERSION } from "./core/index.js";
export type { DurabilityName } from "./core/durability.js";
export { Reservation, type CommitOptions } from "./driver/reservation.js";
export type { Logger } from "./driver/logger.js";
