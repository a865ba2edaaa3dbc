/** A Delivery driven as a driver's loop drives it, one call a step: the time, then the one effect
 * a drain holds (effectAt); the time, then what came of it (answerAt). A drain dates from the
 * wall clock of the latest answer, as the tests were written. */

import type { Delivery, DeliveryEffect, DeliveryInput } from "../../src/core/delivery.js";

const walls = new WeakMap<Delivery, number>();

/** What `delivery` asks for at `now`: its one effect. */
export function effectAt(delivery: Delivery, now: number): DeliveryEffect {
  delivery.handle({ kind: "Tick", now, wallUs: walls.get(delivery) ?? 0 });
  const [effect] = delivery.effects();
  return effect as DeliveryEffect;
}

/** Hand `delivery` what came of its effect, at `now` (monotonic seconds) and `wallUs`. */
export function answerAt(delivery: Delivery, answer: DeliveryInput, now: number, wallUs: number): void {
  walls.set(delivery, wallUs);
  delivery.handle({ kind: "Tick", now, wallUs });
  delivery.handle(answer);
}
