/** Bucket arithmetic. Times are integers: microseconds since the Unix epoch (UTC). */

/** A bucket is five minutes, as Polar's REDUCER_BUCKET_SIZE. */
export const BUCKET_US = 300_000_000;
export const HOUR_US = 3_600_000_000;

/** Start of the bucket holding tUs (a non-negative integer). */
export function floorBucket(tUs: number): number {
  return tUs - (tUs % BUCKET_US);
}

/** A Date as microseconds since the epoch (Dates hold milliseconds). */
export function toUs(moment: Date): number {
  const ms = moment.getTime();
  if (Number.isNaN(ms)) throw new RangeError("an invalid Date has no instant");
  return ms * 1000;
}

/** The Date of tUs (microseconds below a millisecond are dropped: Dates hold milliseconds). */
export function fromUs(tUs: number): Date {
  return new Date(Math.floor(tUs / 1000));
}

function parts(tUs: number): { head: string; micros: number } {
  const ms = Math.floor(tUs / 1000);
  const micros = tUs - ms * 1000 + (ms % 1000) * 1000;
  const iso = new Date(ms).toISOString(); // 2026-12-03T06:13:47.466Z
  return { head: iso.slice(0, 19), micros };
}

/** ISO-8601 with microseconds and Z, the form sent to Polar's ingestion API. */
export function iso(tUs: number): string {
  const { head, micros } = parts(tUs);
  return `${head}.${String(micros).padStart(6, "0")}Z`;
}

/** Python's datetime.isoformat() of the UTC datetime of tUs (the traces' form). */
export function isoPython(tUs: number): string {
  const { head, micros } = parts(tUs);
  return micros ? `${head}.${String(micros).padStart(6, "0")}+00:00` : `${head}+00:00`;
}
