/** Parsing the changes our scripts reply with and publish: `{"c": [change, ...]}`, a change being
 * `{"k": state key, "r": revision, "s": [field, value, ...], "d": [field, ...], "full": 1?}`. Lua's
 * cjson writes an empty list as `{}`, so an empty object is read as an empty list. */

import { isObject } from "./aggregate.js";

export interface Change {
  readonly key: string;
  readonly rev: number;
  /** null when the script did not send content (the caller did not follow the identity). */
  readonly set: readonly [string, string][] | null;
  readonly deleted: readonly string[];
  readonly full: boolean;
}

/** A reply or message that is not what our scripts write. */
export class Malformed extends Error {}

const UTF8 = new TextDecoder("utf-8", { fatal: true });

/** Text from a peer: a string, or bytes that must be UTF-8; null otherwise. */
export function textOf(value: unknown): string | null {
  if (typeof value === "string") return value;
  if (value instanceof Uint8Array) {
    try {
      return UTF8.decode(value);
    } catch {
      return null;
    }
  }
  return null;
}

/** The changes of a reply or message; null for a duplicate-track reply. */
/** What the script published, as its reply says it: the first of a pair [message, reply] (a
 * reply with whole states that still carries every change), else the reply itself. */
export function publishedOf(reply: unknown): unknown {
  return Array.isArray(reply) && reply.length === 2 ? reply[0] : reply;
}

/** The changes part of a reply: the second of a pair, else the reply itself. */
export function replyOf(reply: unknown): unknown {
  return Array.isArray(reply) && reply.length === 2 ? reply[1] : reply;
}

/** The changes of a reply or message; null for a duplicate-track reply. With `wanted`, only the
 * changes of the keys it accepts: the others are checked for a key and left unread (every
 * instance hears every change of a shard, and follows few of them). */
export function parseChanges(reply: unknown, wanted?: (key: string) => boolean): Change[] | null {
  const raw = replyOf(reply);
  let text: string;
  if (raw instanceof Uint8Array) {
    const decoded = textOf(raw);
    if (decoded === null) throw new Malformed("not UTF-8");
    text = decoded;
  } else if (typeof raw === "string") {
    text = raw;
  } else {
    throw new Malformed(`expected JSON text, got ${raw === null ? "NoneType" : typeof raw}`);
  }
  if (wanted !== undefined && noneWanted(text, wanted)) return [];
  let obj: unknown;
  try {
    obj = JSON.parse(text);
  } catch {
    throw new Malformed("not JSON");
  }
  if (!isObject(obj)) throw new Malformed("not a JSON object");
  if (obj.dup === 1) return null;
  const items = list(obj.c, "c");
  if (wanted === undefined) return items.map(change);
  return items.filter((item) => wanted(keyOf(item))).map(change);
}

/** Whether every change of `text` is of a key `wanted` refuses, told without parsing it (an
 * instance hears every change of its shards and follows few of their identities). Only when every
 * key is plain text, without escapes: else the parse decides. */
function noneWanted(text: string, wanted: (key: string) => boolean): boolean {
  const keys = Array.from(text.matchAll(KEY), (m) => m[1] as string);
  return keys.length > 0 && keys.length === (text.match(KEY_NAME)?.length ?? 0) && !keys.some(wanted);
}
const KEY = /"k"\s*:\s*"([^"\\]*)"/g;
const KEY_NAME = /"k"\s*:/g;

function keyOf(item: unknown): string {
  const key = isObject(item) ? item.k : undefined;
  if (typeof key !== "string") throw new Malformed("a change needs a key");
  return key;
}

function list(value: unknown, where: string): unknown[] {
  if (isObject(value) && Object.keys(value).length === 0) return [];
  if (!Array.isArray(value)) throw new Malformed(`'${where}' is not a list`);
  return value;
}

function strings(value: unknown, where: string): string[] {
  const items = list(value, where);
  if (!items.every((item) => typeof item === "string")) throw new Malformed(`'${where}' holds a non-string`);
  return items as string[];
}

function change(item: unknown): Change {
  if (!isObject(item)) throw new Malformed("a change is not an object");
  const { k: key, r: rev } = item;
  if (typeof key !== "string" || !Number.isSafeInteger(rev) || (rev as number) < 0) {
    throw new Malformed("a change needs a key and a revision");
  }
  if (!("s" in item)) return { key, rev: rev as number, set: null, deleted: [], full: false };
  const flat = strings(item.s, "s");
  if (flat.length % 2) throw new Malformed("'s' holds an odd number of items");
  const pairs: [string, string][] = [];
  for (let i = 0; i < flat.length; i += 2) pairs.push([flat[i] as string, flat[i + 1] as string]);
  // Absent is none; null is no list the scripts write (Python refuses it too).
  const deleted = "d" in item ? strings(item.d, "d") : [];
  // The scripts write 1 or nothing (JSON's 1.0 is 1 here, as in Python; true is not).
  if ("full" in item && item.full !== 1) throw new Malformed("'full' is not 1");
  return { key, rev: rev as number, set: pairs, deleted, full: "full" in item };
}
