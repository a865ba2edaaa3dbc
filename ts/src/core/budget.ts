/** The request budget for Polar's API that every instance of an organization shares: Polar's
 * limit is per organization (outpost_core/_budget.py explains the numbers). A delivery loop takes
 * one request from a token bucket in Redis (budget.lua, on Redis's clock) before each ingestion
 * request; an empty bucket reserves the next request for the caller and says when it comes. */

import { BUDGET_KEY } from "./keys.js";

/** Longest a loop waits before asking the budget again: a reply asking for more (a budget set
 * absurdly low by another instance) is not trusted further. */
export const MAX_WAIT = 60.0;

/** Run budget (KEYS: the budget key; ARGV: per minute, capacity, "" for Redis's clock); report
 * BudgetAnswered. */
export interface TakeRequest {
  kind: "TakeRequest";
  key: string;
  perMinute: number;
  capacity: number;
}

/** The script's reply: the µs to wait before sending the request taken (0: now). */
export interface BudgetAnswered {
  kind: "BudgetAnswered";
  reply: unknown;
}

/** The bucket's size: a fifteenth of a minute's requests, at least one. */
export function capacity(perMinute: number): number {
  return Math.max(1, Math.floor(perMinute / 15));
}

export function take(perMinute: number): TakeRequest {
  return { kind: "TakeRequest", key: BUDGET_KEY, perMinute, capacity: capacity(perMinute) };
}

/** Seconds to wait before sending the request taken (0: now); null for a reply that is not a
 * count of microseconds (the caller counts it and goes ahead: Polar's 429 still holds it back). */
export function waitOf(outcome: BudgetAnswered): number | null {
  let reply = outcome.reply;
  if (reply instanceof Uint8Array) reply = Buffer.from(reply).toString("latin1");
  if (typeof reply === "string") {
    // Python's int(): optional sign and surrounding whitespace, ASCII digits, underscores between.
    const text = reply.trim();
    if (!/^[+-]?[0-9]+(_[0-9]+)*$/.test(text)) return null;
    reply = Number(text.replace(/_/g, ""));
  }
  if (typeof reply === "bigint") reply = Number(reply);
  if (typeof reply !== "number" || !Number.isInteger(reply) || reply < 0) return null;
  return Math.min(reply / 1e6, MAX_WAIT);
}
