/** The supervisor every background loop runs under: a loop that fails is logged, reminded of, and
 * started again; none dies for good, and none silently. */

import { type DriverContext, REMINDER_S, stackOf } from "./context.js";
import { logError } from "./logger.js";
import { monotonic } from "./signal.js";

const RESTART_BASE_S = 0.1; // seconds before a failed loop's first restart, doubled per failure in a row
export const RESTART_CAP_S = 5.0;

/** Run a background loop until the instance closes. One that fails (a bug of ours: Redis
 * failures are retried inside each loop) is logged with its stack, then reminded of at most
 * once a minute while it keeps failing, and started again after a backoff (0.1 s, doubled per
 * failure in a row, up to 5 s): no loop dies for good, and none silently. */
export async function supervised(ctx: DriverContext, name: string, loop: (restarted: boolean) => Promise<void>): Promise<void> {
  let [failures, startedAt, remindedAt] = [0, monotonic(), -Infinity];
  while (!ctx.closed) {
    try {
      await loop(failures > 0);
      return;
    } catch (exc) {
      if (ctx.closed) return;
      const now = monotonic();
      failures = now - startedAt >= REMINDER_S ? 1 : failures + 1; // a long run starts over
      if (failures === 1 || now - remindedAt >= REMINDER_S) {
        remindedAt = now;
        logError(ctx.log, `outpost: the ${name} loop failed (${failures} in a row; restarted): ${stackOf(exc)}`);
      }
      await ctx.pause(Math.min(RESTART_CAP_S, RESTART_BASE_S * 2 ** (failures - 1)));
      startedAt = monotonic();
    }
  }
}
