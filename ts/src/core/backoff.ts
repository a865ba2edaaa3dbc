/** One backoff for every retry the core or a driver schedules (outpost_core/_backoff.py).
 *
 * Exponential from `base` seconds, doubling per attempt up to `cap`, with "equal jitter": the
 * delay is drawn uniformly from the upper half of the ceiling, so instances that failed together
 * spread out without ever retrying at once. The draw comes in as data (`draw` in [0, 1)). */

import { UsageError } from "./errors.js";

/** Seconds to wait before retry number `attempt` (1 for the first retry). */
export function backoff(attempt: number, base: number, cap: number, draw: number): number {
  if (attempt < 1) throw new UsageError(`backoff attempts count from 1, got ${attempt}`);
  const ceiling = Math.min(cap, base * 2.0 ** (attempt - 1));
  return ceiling * (0.5 + 0.5 * draw);
}
