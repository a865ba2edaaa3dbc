/** The tick loop: time passes for the core (a Tick at each of its deadlines, and at least every
 * POLL seconds), and telemetry's records go out at their interval. */

import { type DriverContext, POLL } from "./context.js";
import type { SessionEffects } from "./effects.js";
import { monotonic } from "./signal.js";

export async function tickLoop(ctx: DriverContext, effects: SessionEffects): Promise<void> {
  while (!ctx.closed) {
    const version = ctx.signal.version;
    effects.tick();
    if (ctx.telemetry.enabled) {
      const organization = ctx.core.configuration?.organizationId;
      if (organization !== undefined) ctx.telemetry.exportToRelay(organization);
      void ctx.telemetry.flush(monotonic(), ...ctx.syncCounts()); // records in slices; ticks go on
    }
    await ctx.signal.wait(version, untilDeadline(ctx));
  }
}

function untilDeadline(ctx: DriverContext): number {
  const deadline = ctx.core.nextDeadline();
  if (deadline === null) return POLL;
  return Math.min(Math.max(deadline - monotonic(), 0), POLL);
}
