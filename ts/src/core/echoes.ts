/** Recognising this instance's own changes when they come back over pub/sub
 * (outpost_core/_echoes.py). A script publishes its change and replies with the very same text
 * when the caller held the previous revision of every identity, or with that text beside its own
 * when it answers with whole states; either reply carries all its echo does, so the subscriber
 * skips the echo without parsing it. Bounded: an echo that never comes (the subscription was
 * down) is forgotten in time. */

import { publishedOf } from "./changes.js";

export class Echoes {
  private readonly expected = new Map<string, 0>();

  constructor(private readonly size = 4096) {}

  /** A script of this instance replied: its echo may follow (the reply itself, or the published
   * text a pair carries). */
  expect(reply: unknown): void {
    const key = keyOf(publishedOf(reply));
    if (key === null) return;
    this.expected.set(key, 0); // an existing key keeps its place, as in an OrderedDict
    if (this.expected.size > this.size) {
      const oldest = this.expected.keys().next().value as string;
      this.expected.delete(oldest);
    }
  }

  /** Whether data (a message from the channel) is an expected echo; forget it if so. */
  seen(data: unknown): boolean {
    const key = keyOf(data);
    if (key === null || !this.expected.has(key)) return false;
    this.expected.delete(key);
    return true;
  }

  get length(): number {
    return this.expected.size;
  }
}

/** Text and bytes compare by content (bytes as latin-1, so they never equal a different text). */
function keyOf(value: unknown): string | null {
  if (typeof value === "string") return `s${value}`;
  if (value instanceof Uint8Array) return `b${Buffer.from(value).toString("latin1")}`;
  return null;
}
