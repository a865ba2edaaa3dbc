/** What the delivery loops of one instance do when Redis fails them, and when a loop reads this
 * consumer's own pending entries again (outpost_core/_delivery_recovery.py).
 *
 * A settlement Redis acknowledged and then lost (a fail-over to a replica that never got it, a
 * restart without its data) leaves its outbox entries pending for this instance's consumer, where
 * nothing would deliver them before claimIdle. So after any Redis failure the instance meets (a
 * delivery loop's, or one elsewhere: the change subscription, a state load, a dropped connection),
 * and after a delivery loop's restart, one read of a loop takes this consumer's pending entries
 * again (`XREADGROUP ... 0`) instead of new ones. That read waits until no loop holds entries and
 * none has some in flight (a read, a claim, a settle): they would be posted twice. While it waits,
 * a loop reads new entries without blocking and rests on the deliveries signal: a loop blocked in
 * its read would keep the others from the re-read, each in turn.
 *
 * A delivery loop's own Redis failure is retried: backing off by the loop's Outage (which says
 * when an outage starts, reminds, ends), or, when the error says Redis lost its data (lostItsData:
 * the groups are gone), creating the groups again at once; never once the instance is closing
 * (the work stays queued in Redis).
 *
 * One DeliveryRecovery per instance, beside its loops' Delivery machines; the driver does what it
 * answers. */

import { UsageError } from "./errors.js";
import { Outage, type Report } from "./outage.js";

/** Seconds a loop waits after creating the groups again, before it tries once more. */
export const LOST_DATA_WAIT = 0.05;

/** Which read a loop does: "now" this consumer's pending entries again; "waiting" new entries
 * without blocking, then rest (a re-read is due, but a loop holds or moves entries); "no" new
 * entries, as asked (none is due). */
export type Reread = "now" | "waiting" | "no";

/** What a loop does after a Redis failure, before it tries again: wait `seconds` (logging
 * `report` first, if any); create the outbox groups again (a failure there is ignored: the next
 * try meets it again), then wait `seconds`; or stop trying, the instance closing (what the call
 * would have done stays queued). */
export type AfterFailure =
  | { kind: "BackOff"; seconds: number; report: Report | null }
  | { kind: "RecreateGroups"; seconds: number }
  | { kind: "GiveUp" };

/** Whether a Redis error says the outbox group is gone: Redis restarted without its data, or
 * someone flushed it (a read says NOGROUP, a survey "no such key"). */
export function lostItsData(error: string): boolean {
  return error.includes("NOGROUP") || error.includes("no such key");
}

/** One instance's rule for Redis failures of its delivery loops and for re-reads of its pending
 * entries. Loops are numbered from 0. */
export class DeliveryRecovery {
  /** Redis failures this instance met, in any loop (delivery's or another). */
  failures = 0;
  private readonly outages = new Map<number, Outage>();
  private due = false;
  private reading = 0;

  /** A call of delivery loop `loop` failed in Redis (`error`, its text; `lostData`:
   * lostItsData(error); `draw` in [0, 1), the backoff's jitter). What to do before trying again. */
  failed(loop: number, now: number, error: string, draw: number, options: { lostData: boolean; closing: boolean }): AfterFailure {
    const outage = this.outage(loop);
    if (options.closing) return { kind: "GiveUp" };
    this.failures += 1;
    this.due = true;
    if (options.lostData) return { kind: "RecreateGroups", seconds: LOST_DATA_WAIT };
    const [seconds, report] = outage.failed(now, error, draw);
    return { kind: "BackOff", seconds, report };
  }

  /** The read a loop does beside a post, tried once, failed in Redis: it found nothing, and what
   * it may have taken is read again later. The failure counts as the loop's (what to log); no
   * wait, the post goes on. */
  readBesidePostFailed(loop: number, now: number, error: string, draw: number, options: { closing: boolean }): Report | null {
    const outage = this.outage(loop);
    if (options.closing) return null;
    this.failures += 1;
    this.due = true;
    return outage.failed(now, error, draw)[1];
  }

  /** A call of delivery loop `loop` succeeded: what to log if that ends its outage. */
  answered(loop: number, now: number): Report | null {
    return this.outage(loop).succeeded(now);
  }

  /** A Redis failure outside the delivery loops (the subscription, a state load, a connection
   * that dropped). */
  failedElsewhere(): void {
    this.failures += 1;
    this.due = true;
  }

  /** Delivery loop `loop` starts again with a fresh Delivery: what the old one held is still
   * pending for this consumer. */
  restarted(loop: number): void {
    this.outage(loop);
    this.due = true;
  }

  /** A loop is about to read (`allIdle`: every loop's Delivery of this instance is idle, its own
   * included). A "now" is the one re-read of what was due. */
  nextRead(allIdle: boolean): Reread {
    if (!this.due) return "no";
    if (this.reading || !allIdle) return "waiting";
    this.due = false;
    return "now";
  }

  /** A re-read filled its count: more may be pending, for a later read to take. */
  morePending(): void {
    this.due = true;
  }

  /** A loop began a read of entries, or a claim or settle of some (each changes this consumer's
   * pending entries as a read does). Told after nextRead, before anything else runs. */
  readStarted(): void {
    this.reading += 1;
  }

  /** One that began ended, whatever came of it. */
  readEnded(): void {
    if (!this.reading) throw new UsageError("readEnded() without a readStarted() still open");
    this.reading -= 1;
  }

  private outage(loop: number): Outage {
    if (!Number.isInteger(loop) || loop < 0) throw new UsageError(`delivery loops are numbered from 0, got ${loop}`);
    let outage = this.outages.get(loop);
    if (outage === undefined) {
      outage = new Outage(`delivery ${loop}`);
      this.outages.set(loop, outage);
    }
    return outage;
  }
}
