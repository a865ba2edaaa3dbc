/** What one flush() waits for, and when it looks (outpost_core/_flush.py).
 *
 * A flush is done when every entry the outboxes held as it began has left them: delivered or
 * dropped, then settled, by this instance or another. It learns that by reading the outboxes (the
 * last entry of each as it begins; later, whether anything up to that mark is left), which costs a
 * command per stream, so it does not look at every change: it looks when this instance's loops
 * hold nothing any more (they may just have settled the last of it), and at least every LOOK
 * seconds for what other instances settle; never while a settle runs (half of a batch would look
 * settled).
 *
 * Sans-IO: the driver reads the outboxes and tells FlushWatch what it found. */

import { UsageError } from "./errors.js";

/** Seconds between two looks at the outboxes, at the most, while a flush waits. */
export const LOOK = 0.05;

/** A stream entry's id as Redis replies it (a Buffer from the *Buffer commands). */
export type EntryId = string | Buffer;

/** Each stream's last entry id from its `XREVRANGE ... COUNT 1` reply (one reply per stream, in
 * order); a stream that is empty, or whose reply is not one (a peer's), has none. */
export function lastEntries(streams: readonly string[], replies: readonly unknown[]): Map<string, EntryId> {
  if (streams.length !== replies.length) throw new UsageError(`${streams.length} streams but ${replies.length} replies`);
  const marks = new Map<string, EntryId>();
  streams.forEach((stream, i) => {
    const reply = replies[i];
    if (!Array.isArray(reply) || !Array.isArray(reply[0])) return;
    const id: unknown = reply[0][0];
    if (typeof id === "string" || Buffer.isBuffer(id)) marks.set(stream, id);
  });
  return marks;
}

export class FlushWatch {
  private readonly left: Map<string, EntryId>;
  private readonly deadline: number;
  private lookedAt = -Infinity;

  constructor(marks: ReadonlyMap<string, EntryId>, now: number, timeout: number) {
    this.left = new Map(marks);
    this.deadline = now + timeout;
  }

  /** The streams that still hold an entry up to their mark, and that mark. */
  get marks(): ReadonlyMap<string, EntryId> {
    return this.left;
  }

  /** Whether to read the outboxes now (the look counts as taken). */
  lookNow(now: number, { settling, holdingNothing }: { settling: boolean; holdingNothing: boolean }): boolean {
    if (settling || !(holdingNothing || now - this.lookedAt >= LOOK)) return false;
    this.lookedAt = now;
    return true;
  }

  /** What a look found: per stream of `marks` (all of them or some), whether any entry up to its
   * mark is still there. Whether the flush is done. */
  looked(left: ReadonlyMap<string, boolean>): boolean {
    for (const [stream, remains] of left) {
      if (!remains) this.left.delete(stream);
    }
    return this.done;
  }

  get done(): boolean {
    return this.left.size === 0;
  }

  /** Seconds to wait before asking lookNow again (a settle of this instance may end the wait
   * sooner); null once the flush has timed out. */
  wait(now: number): number | null {
    const remaining = this.deadline - now;
    return remaining <= 0 ? null : Math.min(remaining, LOOK);
  }
}
