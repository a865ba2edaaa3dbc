/** Which outbox consumers are dead, and what a live instance takes from them
 * (outpost_core/_liveness.py explains the protocol). Every instance keeps a heartbeat key its
 * delivery loop refreshes every quarter of `heartbeat` seconds; a consumer of the outbox group
 * whose heartbeat key is gone is dead, and a live instance runs reclaim for it: it takes over the
 * entries the dead one holds, and removes it from the group once it holds nothing. */

import { textOf } from "./changes.js";
import { isObject } from "./aggregate.js";
import { jsonOr } from "./json.js";
import { allOutboxes, heartbeatKey } from "./keys.js";
import { byCodePoint } from "./pyrepr.js";

// -- actions ------------------------------------------------------------------------------------

/** SET key 1 PX ttlMs: this instance is alive for ttlMs more milliseconds. */
export interface Beat {
  kind: "Beat";
  key: string;
  ttlMs: number;
}

/** XINFO CONSUMERS <each outbox stream> outpost; report ConsumersListed. */
export interface SurveyConsumers {
  kind: "SurveyConsumers";
}

/** MGET the heartbeat keys (one slot); report HeartbeatsChecked. */
export interface CheckHeartbeats {
  kind: "CheckHeartbeats";
  keys: string[];
}

/** Run reclaim on one stream: taker takes up to count entries of each of consumers (none when
 * taker is empty) and those holding nothing are removed. Report Reclaimed. */
export interface Reclaim {
  kind: "Reclaim";
  stream: string;
  taker: string;
  count: number;
  consumers: string[];
}

/** DEL key: a closing instance is dead from now on. */
export interface ForgetHeartbeat {
  kind: "ForgetHeartbeat";
  key: string;
}

// -- outcomes -----------------------------------------------------------------------------------

/** (stream, XINFO CONSUMERS reply) for each outbox stream, as Redis answered. */
export interface ConsumersListed {
  kind: "ConsumersListed";
  listing: [string, unknown][];
}

/** MGET's reply: one value (null when the key is gone) per key asked. */
export interface HeartbeatsChecked {
  kind: "HeartbeatsChecked";
  values: unknown[];
}

/** The reclaim script's reply, as Redis answered. */
export interface Reclaimed {
  kind: "Reclaimed";
  stream: string;
  reply: unknown;
}

// -- decisions ----------------------------------------------------------------------------------

/** How often a loop beats and surveys: four beats per time to live, so one late beat never lets
 * the key expire. */
export function interval(heartbeat: number): number {
  return heartbeat / 4;
}

export function beat(consumer: string, heartbeat: number): Beat {
  return { kind: "Beat", key: heartbeatKey(consumer), ttlMs: Math.max(1, pyRound(heartbeat * 1000)) };
}

/** Python's round(): halves go to the even neighbour. */
function pyRound(x: number): number {
  const floor = Math.floor(x);
  const diff = x - floor;
  if (diff > 0.5) return floor + 1;
  if (diff < 0.5) return floor;
  return floor % 2 === 0 ? floor : floor + 1;
}

const outboxSets = new Map<number, Set<string>>(); // per shard count: a few per process

/** Every other consumer of each outbox stream, and how many listed items were unreadable. */
export function consumersOf(listing: [string, unknown][], me: string, shards: number): [Map<string, Set<string>>, number] {
  let outboxes = outboxSets.get(shards);
  if (outboxes === undefined) outboxSets.set(shards, (outboxes = new Set(allOutboxes(shards))));
  const out = new Map<string, Set<string>>();
  let rejected = 0;
  for (const [stream, reply] of listing) {
    for (const item of Array.isArray(reply) ? reply : [reply]) {
      const name = textOf(nameOf(item));
      if (name === null || !outboxes.has(stream)) {
        rejected += 1;
      } else if (name !== me) {
        const names = out.get(stream) ?? new Set<string>();
        names.add(name);
        out.set(stream, names);
      }
    }
  }
  return [out, rejected];
}

/** An XINFO CONSUMERS item's name: a map (decoded), an object, or a flat [field, value, ...] list
 * (as ioredis answers). */
function nameOf(item: unknown): unknown {
  if (item instanceof Map) return item.get("name") ?? null;
  if (Array.isArray(item)) {
    for (let i = 0; i + 1 < item.length; i += 2) if (textOf(item[i]) === "name") return item[i + 1];
    return null;
  }
  return isObject(item) ? (item.name ?? null) : null;
}

/** The heartbeats to look at: one per consumer seen (null when there is none). */
export function check(consumers: Map<string, Set<string>>): [string[], CheckHeartbeats] | null {
  const names = [...new Set([...consumers.values()].flatMap((s) => [...s]))].sort(byCodePoint);
  if (!names.length) return null;
  return [names, { kind: "CheckHeartbeats", keys: names.map(heartbeatKey) }];
}

/** A Reclaim for each stream where a consumer whose heartbeat is gone holds a place; an answer of
 * the wrong length is rejected whole (nothing is taken: the next survey asks again). */
export function reclaims(
  consumers: Map<string, Set<string>>,
  names: string[],
  values: unknown,
  me: string,
  count: number,
): [Reclaim[], number] {
  if (!Array.isArray(values) || values.length !== names.length) return [[], 1];
  const dead = new Set(names.filter((_, i) => values[i] === null || values[i] === undefined));
  const calls: Reclaim[] = [];
  for (const stream of [...consumers.keys()].sort(byCodePoint)) {
    const gone = [...(consumers.get(stream) as Set<string>)].filter((n) => dead.has(n)).sort(byCodePoint);
    if (gone.length) calls.push({ kind: "Reclaim", stream, taker: me, count, consumers: gone });
  }
  return [calls, 0];
}

export type TakenEntry = [string, string, Map<string, unknown>];

/** The entries reclaim took, as (stream, id, fields), and how many consumers it removed; null for
 * an unreadable reply (taken entries then wait for the claimIdle fallback). */
export function takenEntries(outcome: Reclaimed): [TakenEntry[], number] | null {
  const text = textOf(outcome.reply);
  if (text === null) return null;
  const reply = jsonOr(text, null);
  if (!isObject(reply)) return null;
  let entries = reply.e;
  let removed = reply.d;
  if (isEmptyObject(entries)) entries = []; // cjson writes an empty list as {}
  if (isEmptyObject(removed)) removed = [];
  if (!Array.isArray(entries) || !Array.isArray(removed)) return null;
  const out: TakenEntry[] = [];
  for (const entry of entries as unknown[]) {
    if (!Array.isArray(entry) || entry.length !== 2 || typeof entry[0] !== "string" || !Array.isArray(entry[1]) || entry[1].length % 2) {
      return null;
    }
    const flat = entry[1] as unknown[];
    const fields = new Map<string, unknown>();
    for (let i = 0; i < flat.length; i += 2) fields.set(flat[i] as string, flat[i + 1]);
    out.push([outcome.stream, entry[0], fields]);
  }
  return [out, removed.length];
}

function isEmptyObject(value: unknown): boolean {
  return isObject(value) && Object.keys(value).length === 0;
}

/** What a closing instance runs after its loops stopped: its heartbeat goes, so others take what
 * it still holds at their next survey, and it leaves every group where it holds nothing. */
export function handBack(consumer: string, shards: number): (ForgetHeartbeat | Reclaim)[] {
  return [
    { kind: "ForgetHeartbeat", key: heartbeatKey(consumer) },
    ...allOutboxes(shards).map((stream): Reclaim => ({ kind: "Reclaim", stream, taker: "", count: 0, consumers: [consumer] })),
  ];
}
