/** The deployment's shard count: chosen once, stored in Redis, the same for every instance
 * (outpost_core/_shards.py, the same rules).
 *
 * Every key of a customer, its outbox stream and its channel carry its shard (keys.ts), so two
 * instances that count shards differently write one customer under two keys, and neither counts
 * the other's events. The count lives in Redis (SHARDS_KEY), written once, by the first instance
 * that starts on a Redis holding none or by the operator (`outpost shards`). An instance checks it
 * before its first write and refuses to start on any other count.
 *
 * A Redis holding outbox streams but no count was written by instances that could not choose one:
 * they used 16. The first instance there stores 16, whatever it was configured with. */

import { textOf } from "./changes.js";
import { ConfigurationError } from "./errors.js";
import { DEFAULT_SHARDS, MAX_SHARDS, SHARDS_KEY } from "./keys.js";

const SHOWN = 40; // characters of an unreadable stored value quoted in the refusal

/** A shard count as configured: an integer from 1 to MAX_SHARDS. */
export function checkedShards(count: unknown): number {
  if (typeof count !== "number" || !Number.isInteger(count)) {
    throw new ConfigurationError(`shards must be an integer, not ${typeof count === "number" ? count : typeof count}`);
  }
  if (count < 1 || count > MAX_SHARDS) throw new ConfigurationError(`shards must be from 1 to ${MAX_SHARDS}, not ${count}`);
  return count;
}

/** The count Redis stores (bytes or text of a decimal), or null when it is none. */
export function parseShards(raw: unknown): number | null {
  const text = textOf(raw);
  if (text === null || !/^[0-9]{1,5}$/.test(text)) return null;
  const count = Number(text);
  return count >= 1 && count <= MAX_SHARDS ? count : null;
}

/** What the first instance stores where Redis holds no count: its own, unless instances that
 * could not choose one (`legacy`: their outbox streams are there) used the default. */
export function firstCount(configured: number, legacy: boolean): number {
  return legacy ? DEFAULT_SHARDS : configured;
}

function shown(raw: unknown): string {
  const text = textOf(raw) ?? String(raw);
  const cut = text.length > SHOWN ? `${text.slice(0, SHOWN)}... (${text.length - SHOWN} more characters)` : text;
  return cut.replace(/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu, (c) => `\\x${(c.codePointAt(0) as number).toString(16).padStart(2, "0")}`);
}

/** Why an instance configured for `configured` shards must not start beside the stored count
 * (null: they agree). */
export function shardsDisagreement(configured: number, raw: unknown): string | null {
  const stored = parseShards(raw);
  if (stored === configured) return null;
  const found = stored === null ? `an unreadable shard count (${shown(raw)})` : `${stored} shards`;
  return (
    `this instance is configured for ${configured} shards but the deployment's Redis holds ${found} at ${SHARDS_KEY}: ` +
    "every instance of a deployment must use its shard count (`outpost shards` shows it; docs/redis-layout.md says how to change it)"
  );
}
