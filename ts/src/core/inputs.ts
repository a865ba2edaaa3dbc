/** What happened, as the driver reports it to the core: plain, past-tense, serialisable. The same
 * inputs as outpost_core/_inputs.py, fields in camelCase, told apart by `kind`. */

/** Fields of a Redis hash as a client answers them: text or bytes, in a Map or an object. */
export type RawFields = Map<unknown, unknown> | Record<string, unknown>;

export type Input =
  /** Polar's configuration payload arrived (WebSocket) or was read from the Redis cache. */
  | { kind: "ConfigurationReceived"; payload: unknown; fromCache: boolean }
  /** A script of ours answered (the raw reply, bytes or text). `ticket`: what Session.scriptSent
   * gave a script of this instance that writes customers' state (track, an admission); with one,
   * `reply` may be null: the script wrote nothing (an admission refused). */
  | { kind: "ScriptReplied"; reply: unknown; tag: number | null; ticket?: number | null }
  /** A script could not run (Redis failed): a tagged one the core asked for (`tag`), or a script
   * of this instance with its ticket (`ticket`, from Session.scriptSent). */
  | { kind: "ScriptFailed"; tag: number | null; ticket?: number | null }
  /** A message arrived on one of the shard channels. */
  | { kind: "ChangePublished"; data: unknown }
  /** Redis confirmed the subscription to every shard channel (the first time, or again after a
   * break): messages may have been missed before, so every copy reloads, and copies loaded from
   * now on follow Redis. */
  | { kind: "SubscriberRestarted" }
  /** Redis confirmed a subscription to a shard channel: count channels are subscribed now (one
   * at a time). All of them is SubscriberRestarted; a first one while subscribed is a
   * re-subscription after a break (SubscriberLost first). */
  | { kind: "SubscriptionConfirmed"; count: number }
  /** The pub/sub connection broke: until SubscriberRestarted no copy follows Redis, and reads go
   * to Redis instead of memory. */
  | { kind: "SubscriberLost" }
  /** Redis confirmed the subscription to one shard channel on its own (a cluster driver
   * subscribes each shard on the node that owns it): that shard's copies reload and follow from
   * now on; the other shards' copies are left alone. */
  | { kind: "ChannelSubscribed"; channel: unknown }
  /** The subscriptions to these shard channels broke (their node failed, their slot moved):
   * until each is confirmed again, that shard's copies do not follow Redis. */
  | { kind: "ChannelsLost"; channels: unknown[] }
  /** HGETALL key answered the load loadId (from LoadIdentity). */
  | { kind: "IdentityLoaded"; key: string; fields: RawFields; loadId: number }
  /** HGETALL key failed for the load loadId; the core asks again later. */
  | { kind: "LoadFailed"; key: string; loadId: number }
  /** The client is closing: say goodbye to Polar and stop reconnecting. */
  | { kind: "Closing" }
  /** Time passed: now is monotonic seconds, wallUs the wall clock in µs since the epoch. */
  | { kind: "Tick"; now: number; wallUs: number }
  /** The fields of each hash a ListPending asked for (state hashes, then cold buckets' events hashes). */
  | { kind: "PendingListed"; tag: number; fields: Map<string, unknown[]> | Record<string, unknown[]> }
  | { kind: "ListFailed"; tag: number }
  /** The TCP (and TLS) connection to Polar is open. */
  | { kind: "ConnectionOpened"; now: number }
  /** Opening failed, or the open connection broke. */
  | { kind: "ConnectionFailed"; now: number; reason: string }
  /** Bytes from the WebSocket connection; empty means the peer closed it. */
  | { kind: "BytesReceived"; now: number; data: Uint8Array };

export type InputKind = Input["kind"];
