/** Outpost for TypeScript: a local, exact copy of Polar usage in a Redis you own. */
export { Outpost, DEFAULT_REDIS_URL, DEFAULT_SERVER_URL, type OutpostOptions, type TrackOptions, type CustomerOptions, type Clock, type DroppedCallback } from "./driver/outpost.js";
export { Aggregate, Balance, Customer, InvalidEvent, NotReady, OutpostClosed, OutpostError, RedisUnavailable, UnknownMeter, UnsupportedMeter, UsageError, VERSION } from "./core/index.js";
