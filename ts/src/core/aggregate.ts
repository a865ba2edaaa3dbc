/** Count, sum, min and max of a set of events, as Polar keeps them in its bucket rows.
 *
 * The Redis form is four space-separated numbers, min and max `-` when the set is empty; the Lua
 * scripts read and write the same form, numbers as lib.lua's `fmt` writes them. */

const EXACT_INT = 2 ** 53;
const NUMBER = /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/;

/** C's `%.<digits>g`. */
function formatG(value: number, digits: number): string {
  const exponential = value.toExponential(digits - 1);
  const exponent = Number(exponential.slice(exponential.indexOf("e") + 1));
  if (exponent < -4 || exponent >= digits) {
    let [mantissa, exp] = exponential.split("e") as [string, string];
    if (mantissa.includes(".")) mantissa = mantissa.replace(/\.?0+$/, "");
    const sign = exp.startsWith("-") ? "-" : "+";
    return `${mantissa}e${sign}${exp.replace(/^[-+]/, "").padStart(2, "0")}`;
  }
  let fixed = value.toFixed(Math.max(0, digits - 1 - exponent));
  if (fixed.includes(".")) fixed = fixed.replace(/\.?0+$/, "");
  return fixed;
}

/** Exactly as the scripts' `fmt` writes a number: integral values below 2**53 without a point,
 * others in the shortest of %.15g, %.16g, %.17g that reads back exactly. */
export function formatNumber(value: number): string {
  if (Number.isInteger(value) && Math.abs(value) < EXACT_INT) return value === 0 ? "0" : String(value);
  for (const digits of [15, 16]) {
    const text = formatG(value, digits);
    if (Number(text) === value) return text;
  }
  return formatG(value, 17);
}

/** A number as the scripts write it (tonumber reads it the same); null otherwise. */
export function parseNumber(text: string): number | null {
  if (!NUMBER.test(text)) return null;
  const value = Number(text);
  return Number.isFinite(value) ? value : null;
}

/** A finite number (not a boolean). */
export function isNumber(value: unknown): value is number {
  return typeof value === "number" && Number.isFinite(value);
}

export type Func = "count" | "sum" | "avg" | "min" | "max";

export class Aggregate {
  constructor(
    readonly count: number = 0,
    readonly sum: number = 0,
    readonly min: number | null = null,
    readonly max: number | null = null,
  ) {}

  static of(values: Iterable<number>): Aggregate {
    let total = EMPTY;
    for (const value of values) total = total.add(value);
    return total;
  }

  add(value: number): Aggregate {
    return new Aggregate(
      this.count + 1,
      this.sum + value,
      this.min === null ? value : Math.min(this.min, value),
      this.max === null ? value : Math.max(this.max, value),
    );
  }

  merge(other: Aggregate): Aggregate {
    if (other.count === 0) return this;
    if (this.count === 0) return other;
    return new Aggregate(
      this.count + other.count,
      this.sum + other.sum,
      Math.min(this.min as number, other.min as number),
      Math.max(this.max as number, other.max as number),
    );
  }

  /** The consumed units under aggregation func, as Polar's usage read returns them. */
  quantity(func: string): number {
    switch (func) {
      case "count":
        return this.count;
      case "sum":
        return this.sum;
      case "avg":
        return this.count ? this.sum / this.count : 0;
      case "min":
        return this.min ?? 0;
      case "max":
        return this.max ?? 0;
      default:
        throw new RangeError(`aggregation '${func}' has no bucketed quantity`);
    }
  }

  encode(): string {
    const lo = this.min === null ? "-" : formatNumber(this.min);
    const hi = this.max === null ? "-" : formatNumber(this.max);
    return `${this.count} ${formatNumber(this.sum)} ${lo} ${hi}`;
  }

  /** Parse the Redis form; null when the text is not one (a peer wrote garbage). */
  static decode(text: string): Aggregate | null {
    const parts = text.split(" ");
    if (parts.length !== 4 || !/^[0-9]{1,20}$/.test(parts[0] as string)) return null;
    const count = Number(parts[0]);
    const total = parseNumber(parts[1] as string);
    if (total === null) return null;
    if (count === 0) return parts[2] === "-" && parts[3] === "-" && total === 0 ? EMPTY : null;
    const lo = parseNumber(parts[2] as string);
    const hi = parseNumber(parts[3] as string);
    if (lo === null || hi === null || lo > hi) return null;
    return new Aggregate(count, total, lo, hi);
  }

  /** Parse Polar's JSON {"count", "sum", "min", "max"}; null when malformed. */
  static fromWire(obj: unknown): Aggregate | null {
    if (!isObject(obj)) return null;
    const { count, sum: total, min: lo, max: hi } = obj;
    if (!Number.isSafeInteger(count) || !isNumber(total)) return null;
    if ((count as number) < 0) return null;
    if (count === 0) return (lo ?? null) === null && (hi ?? null) === null && total === 0 ? EMPTY : null;
    if (!isNumber(lo) || !isNumber(hi) || lo > hi) return null;
    return new Aggregate(count as number, total, lo, hi);
  }
}

export const EMPTY = new Aggregate();

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value) && !(value instanceof Uint8Array) && !(value instanceof Map);
}
