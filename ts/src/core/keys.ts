/** Customer identities and the Redis key layout, version 2 (conformance/README.md §1).
 *
 * Every key of one customer carries the same hash tag, `{<shard>}`: the CRC-32 of the identity
 * modulo the deployment's shard count (16 unless the operator chose another; stored in Redis at
 * SHARDS_KEY, see shards.ts). External ids are percent-encoded where they could break the layout
 * and kept as they are otherwise, so keys stay readable and no two ids share a key. */

export const VERSION = 2;
export const PREFIX = `outpost:v${VERSION}:`;
/** The shard count of a deployment that never chose one (every deployment before it could). */
export const DEFAULT_SHARDS = 16;
/** The most shards a deployment may have: every loop reads, surveys and subscribes to each. */
export const MAX_SHARDS = 1024;
export const CONFIGURATION_KEY = `${PREFIX}configuration`;

export type CustomerKind = "external" | "customer";

const UTF8 = new TextEncoder();

export class Customer {
  constructor(
    readonly kind: CustomerKind,
    readonly id: string,
  ) {}

  /** `external:<id>` (the merchant's id) or `customer:<id>` (Polar's): the identity prefix. */
  get tag(): string {
    return `${this.kind}:${this.id}`;
  }

  /** The identity field of Polar's API: external_customer_id or customer_id. */
  wire(): Record<string, string> {
    return this.kind === "external" ? { external_customer_id: this.id } : { customer_id: this.id };
  }

  toString(): string {
    return this.tag;
  }
}

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

/** The IEEE CRC-32 (zlib's), unsigned. */
export function crc32(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const byte of bytes) crc = (CRC_TABLE[(crc ^ byte) & 0xff] as number) ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

const crcs = new Map<string, number>();

/** The customer's shard among the deployment's `shards`. */
export function shardOf(customer: Customer, shards: number = DEFAULT_SHARDS): number {
  const tag = customer.tag;
  let crc = crcs.get(tag);
  if (crc === undefined) {
    crc = crc32(UTF8.encode(tag));
    if (crcs.size > 65536) crcs.clear(); // keys are built on every track(): cache the hot ones
    crcs.set(tag, crc);
  }
  return crc % shards;
}

// Python's `c.isspace() or not c.isprintable()`: every separator and unprintable character.
const UNSAFE = /^[%:{}\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]$/u;

/** Percent-encode what could break a key; everything else stays readable. */
export function encodeComponent(text: string): string {
  let out = "";
  for (const char of text) {
    if (UNSAFE.test(char)) {
      for (const byte of UTF8.encode(char)) out += "%" + byte.toString(16).toUpperCase().padStart(2, "0");
    } else {
      out += char;
    }
  }
  return out;
}

export function tagOf(shard: number): string {
  return `${PREFIX}{${shard}}:`;
}

export function customerPrefix(customer: Customer, shards: number = DEFAULT_SHARDS): string {
  return `${tagOf(shardOf(customer, shards))}${customer.kind}:${encodeComponent(customer.id)}`;
}

/** The hash of one identity: revision, Polar's totals, cold_until, local aggregates. */
export function stateKey(customer: Customer, reducerId: string, shards: number = DEFAULT_SHARDS): string {
  return `${customerPrefix(customer, shards)}:${encodeComponent(reducerId)}`;
}

/** The hash of the identity's pending events of one bucket (its start, µs), beside its state hash
 * (same hash tag). The state hash's `a:<bucket>` fields say which buckets hold some. */
export function bucketKey(state: string, bucket: number | string): string {
  return `${state}:ev:${bucket}`;
}

/** The sorted set of the identity's acknowledged pending events (member: the events field, score:
 * when Polar acknowledged it, µs). */
export function ackedKey(state: string): string {
  return `${state}:acked`;
}

/** The sharded pub/sub channel every change of the shard's identities is published on; instances
 * on database N > 0 use the namespace `dbN` (pub/sub ignores numbered databases). */
export function channel(shard: number, namespace = ""): string {
  return `${tagOf(shard)}changes${namespace ? `:${namespace}` : ""}`;
}

/** Every shard's channel, in shard order. */
export function allChannels(namespace = "", shards: number = DEFAULT_SHARDS): string[] {
  return Array.from({ length: shards }, (_, shard) => channel(shard, namespace));
}

export function namespaceOfDatabase(db: number): string {
  return db ? `db${db}` : "";
}

/** The stream of events waiting for delivery to Polar. */
export function outboxKey(shard: number): string {
  return `${tagOf(shard)}outbox`;
}

/** The hash tag of the keys every instance shares (heartbeats, the request budget): one slot, so
 * a script or an MGET may touch several of them on Redis Cluster. */
export const FLEET_TAG = `${PREFIX}{fleet}:`;

/** A key that lives while the instance whose outbox consumer is `consumer` is alive. */
export function heartbeatKey(consumer: string): string {
  return `${FLEET_TAG}alive:${encodeComponent(consumer)}`;
}

/** The request budget for Polar's API shared by every instance (a token bucket). */
export const BUDGET_KEY = `${FLEET_TAG}budget`;

/** The deployment's shard count, in decimal: written once, by the first instance that finds it
 * missing or by the operator (`outpost shards`); an instance configured with another refuses to
 * start. */
export const SHARDS_KEY = `${FLEET_TAG}shards`;

/** Every shard's outbox stream, in shard order. */
export function allOutboxes(shards: number = DEFAULT_SHARDS): string[] {
  return Array.from({ length: shards }, (_, shard) => outboxKey(shard));
}
