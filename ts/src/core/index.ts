/** Outpost's sans-IO core: the state machine the driver runs. Nothing here opens a socket, starts
 * a timer, reads a clock or draws a random number: time, event ids and randomness come in as
 * data, and what needs I/O goes out as effects. */

export { Aggregate, formatNumber, parseNumber } from "./aggregate.js";
export { backoff } from "./backoff.js";
export { Balance, computeBalance, mergedState } from "./balance.js";
export { type BudgetAnswered, type TakeRequest, capacity, take, waitOf } from "./budget.js";
export { Configuration, parseConfiguration, type Reducer } from "./configuration.js";
export { Delivery, makeDeliverySettings, nothingDone, withKnownRevs, retryAfter, GROUP, type DeliveryAnswer, type DeliveryEffect, type DeliveryInput, type Flushing, type DeliverySettings, type OutboxEntry, type SettleScript, type PostAndSettle, type PostedAlongside, type ReadOutbox, type OutboxRead, type BatchAnswered, type BatchFailed } from "./delivery.js";
export { DeliveryRecovery, LOST_DATA_WAIT, lostItsData, type AfterFailure, type Reread } from "./deliveryRecovery.js";
export type { Effect, Fetch, RunScript } from "./effects.js";
export { eventIdOf, timestampUsOf } from "./event.js";
export { FlushWatch, lastEntries, type EntryId } from "./flushWatch.js";
export { Durability, PRIMARY, REPLICA, type DurabilityName, type WaitCommand } from "./durability.js";
export { CannotAdmit, ConfigurationError, InsufficientBalance, InvalidEvent, InvalidWebhook, NotDurable, NotReady, OutpostClosed, OutpostError, RedisUnavailable, UnknownMeter, UnsupportedMeter, UsageError } from "./errors.js";
export type { Input, RawFields } from "./inputs.js";
export { BUDGET_KEY, CONFIGURATION_KEY, Customer, DEFAULT_SHARDS, MAX_SHARDS, SHARDS_KEY, ackedKey, allChannels, allOutboxes, bucketKey, channel, customerPrefix, heartbeatKey, namespaceOfDatabase, outboxKey, shardOf, stateKey, encodeComponent, crc32 } from "./keys.js";
export { checkedShards, firstCount, parseShards, shardsDisagreement } from "./shards.js";
export { Link, LinkState, Target, type LinkSettings } from "./link.js";
export {
  type Beat,
  type CheckHeartbeats,
  type ConsumersListed,
  type ForgetHeartbeat,
  type HeartbeatsChecked,
  type Reclaim,
  type Reclaimed,
  type SurveyConsumers,
  handBack,
} from "./liveness.js";
export { Outage, type Report, type ReportLevel } from "./outage.js";
export type { Observation } from "./observations.js";
export {
  ChannelPlacement,
  type NodeBroke,
  type NodeConfirmed,
  type NodeGaveUp,
  type PlacementEffect,
  type PlacementInput,
  type RetireNode,
  type SlotMapRead,
  type SubscribeOnNode,
  type UnsubscribeOnNode,
} from "./placement.js";
export { PythonRandom, type Random, type RandomBytes } from "./random.js";
export { SCRIPT_SHA1, SCRIPT_TEXT } from "./scripts.generated.js";
export { Session, makeSettings, type Settings, type TrackArgs } from "./session.js";
export { BUCKET_US, floorBucket, fromUs, toUs, iso } from "./time.js";

export const VERSION = "0.1.0";
