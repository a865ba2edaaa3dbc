/** The checks of numeric settings, made at construction: NaN passes every comparison, and a
 * fraction or an infinity would reach Redis or Polar from a loop as a command or a header they
 * refuse, again and again. Each names the caller's option, in the Python SDK's words. */

import { UsageError } from "./errors.js";

/** A number, neither NaN nor infinite. */
export const finite = (value: unknown): value is number => typeof value === "number" && Number.isFinite(value);

/** A value as Python's repr writes it, so that both SDKs' messages read alike. */
export function pyRepr(value: unknown): string {
  if (typeof value === "number") return Number.isNaN(value) ? "nan" : value === Infinity ? "inf" : value === -Infinity ? "-inf" : String(value);
  if (typeof value === "string") return `'${value}'`;
  if (typeof value === "boolean") return value ? "True" : "False";
  return String(value);
}

/** `value` an integer of at least `least` (`what` says it). */
export function requireWhole(name: string, value: unknown, least: number, what: string): void {
  if (!Number.isInteger(value) || (value as number) < least) throw new UsageError(`${name} must be an integer, ${what}, got ${pyRepr(value)}`);
}

/** `value` a finite number above 0. */
export function requirePositive(name: string, value: unknown): void {
  if (!finite(value) || value <= 0) throw new UsageError(`${name} must be a positive, finite number, got ${pyRepr(value)}`);
}
