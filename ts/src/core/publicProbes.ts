/** Quantities probes of the public-API mode, sans I/O (outpost_core/_public_probes.py): the
 * request a planned probe makes (GET /v1/meters/{id}/quantities), its answer read from a hostile
 * body (a problem, never a throw), what the planner needs of a followed customer meter, and what
 * a probe's answer writes: the ledger's verdict through apply_anchor.lua, as a reading's, with
 * the anchor's credits and modified_at unchanged (a probe re-anchors consumed only). */

import { isObject } from "./aggregate.js";
import { jsonOr } from "./json.js";
import type { IdentityState } from "./mirror.js";
import { type Anchoring, PUBLIC_SID, anchorWrite, ledgerOf } from "./publicAnchoring.js";
import type { CustomerKind } from "./keys.js";
import { type Followed, ID_PARAMS, type QuantitiesProbe } from "./publicPolls.js";
import { MAX_BODY_BYTES } from "./publicReadings.js";
import { iso } from "./time.js";

const SECOND_US = 1_000_000;
/** The margin for the replica's lag: an event acknowledged (Outpost's clock) more than this
 * before the probe was sent is in its answer. */
export const PROBE_LAG_US = 10 * SECOND_US;

export function quantitiesPath(meterId: string): string {
  return `/v1/meters/${encodeURIComponent(meterId)}/quantities`;
}

/** An instant to the second, as every SDK writes it. */
function second(tUs: number): string {
  return `${iso(tUs - (tUs % SECOND_US)).slice(0, 19)}Z`;
}

/** The query of a probe's request (its window widened to whole seconds). */
export function probeParams(probe: QuantitiesProbe): [string, string][] {
  const rest = probe.endUs % SECOND_US;
  const end = rest === 0 ? probe.endUs : probe.endUs + SECOND_US - rest;
  return [
    [ID_PARAMS[probe.kind], probe.customer],
    ["start_timestamp", second(probe.startUs)],
    ["end_timestamp", second(end)],
    ["interval", probe.interval],
  ];
}

export interface QuantitiesAnswer {
  /** The window's consumed units; null when the body is not a quantities answer. */
  total: number | null;
  problem: string | null;
}

/** A quantities answer's total; a body that is not one gives a problem. */
export function parseQuantities(body: Uint8Array): QuantitiesAnswer {
  if (body.length > MAX_BODY_BYTES) return { total: null, problem: `quantities: body of ${body.length} bytes` };
  let data: unknown;
  try {
    data = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body));
  } catch (exc) {
    return { total: null, problem: `quantities: not JSON (${(exc as Error).name})` };
  }
  const total = isObject(data) ? data.total : undefined;
  if (typeof total !== "number") return { total: null, problem: "quantities without a numeric total" };
  if (!Number.isFinite(total) || total < 0) return { total: null, problem: `quantities: a total of ${total}` };
  return { total, problem: null };
}

/** The reset instant the ledger knows (`h` of its persistent part), if readable. */
function windowStart(pub: string | undefined): number | null {
  if (pub === undefined) return null;
  const data = jsonOr(pub, null);
  const hint = isObject(data) ? data.h : undefined;
  return Number.isSafeInteger(hint) ? (hint as number) : null;
}

/** What the planner needs of a followed customer meter, from its state hash (`state` derived
 * from it, `pub` its ledger's persistent part): the local balance (null until anchored, and for
 * meters never probed), the pending events and the window's start. */
export function followedOf(customer: string, meterId: string, aggregation: string, state: IdentityState, pub: string | undefined, kind: CustomerKind = "external"): Followed {
  let balance: number | null = null;
  const anchored = state.snapshotId === PUBLIC_SID && state.coldUntil !== null;
  if (anchored && (aggregation === "count" || aggregation === "sum")) {
    balance = (state.credits.get(meterId) ?? 0) - state.polar.merge(state.local).quantity(aggregation);
  }
  return { customer, meterId, aggregation, balance, pendingEvents: state.pending, windowStartUs: windowStart(pub), kind };
}

/** Observe a probe's answer (`consumed`, asked at `sentAtUs` on Outpost's clock) on the ledger
 * the state hash and its pending events hold, and say what to write (null: unusable). */
export function probeAnchor(
  aggregation: string,
  marginUs: number,
  fields: Readonly<Record<string, string>>,
  events: Readonly<Record<string, string>>,
  meterId: string,
  consumed: number,
  sentAtUs: number,
  lagUs: number = PROBE_LAG_US,
): Anchoring {
  const problems: string[] = [];
  const ledger = ledgerOf(aggregation, marginUs, fields, events, problems);
  const before = new Set(ledger.entries.keys());
  const outcome = ledger.observeProbe(consumed, sentAtUs, lagUs);
  const anchor = ledger.anchor;
  if (outcome === "probe_unused" || anchor === null || fields.sid !== PUBLIC_SID) {
    return { outcome: "probe_unused", write: null, problems, rejections: ledger.rejections };
  }
  const write = anchorWrite(aggregation, fields, ledger, before, meterId, anchor);
  return { outcome, write, problems, rejections: ledger.rejections };
}
