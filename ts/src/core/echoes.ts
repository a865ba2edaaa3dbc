/** Recognising this instance's own changes when they come back over pub/sub
 * (outpost_core/_echoes.py). A script publishes its change and replies with the very same text
 * when the caller held the previous revision of every identity, or with that text beside its own
 * when it answers with whole states; either reply carries all its echo does, so the subscriber
 * skips the echo without parsing it. Bounded: an echo that never comes (the subscription was
 * down) is forgotten in time.
 *
 * An echo may also come before its reply: the subscriber's connection and the one the script ran
 * on are two sockets, and either may be read first. While scripts of this instance are in flight,
 * a message nobody expects is held, with the scripts that were in flight when it came: only one
 * of those can have published it. Each reply takes its own echo out of what is held; a held
 * message goes to the core once every script it could belong to has replied (then it is some
 * other instance's change). The session owns one (Session.scriptSent, Session.ownEcho, and the
 * tickets its ScriptReplied and ScriptFailed inputs carry). */

import { publishedOf } from "./changes.js";
import { UsageError } from "./errors.js";

export class Echoes {
  private readonly expected = new Map<string, 0>();
  private nextTicket = 0;
  /** The scripts in flight, by ticket, in the order they were sent (the first is the oldest). */
  private readonly inFlight = new Set<number>();
  /** [tickets below this one could have published it, the message], in the order they came. */
  private held: [number, unknown][] = [];

  constructor(private readonly size = 4096) {}

  /** A script of this instance is on its way: a message may be its echo, come early. The ticket
   * goes back with its reply to replied(). */
  sent(): number {
    const ticket = this.nextTicket++;
    this.inFlight.add(ticket);
    return ticket;
  }

  /** Whether a message nobody expects would be held now (scripts are in flight). */
  get holding(): boolean {
    return this.inFlight.size > 0;
  }

  /** The subscriber got data, which it did not expect: whether it is held (a script is in
   * flight, and this may be its echo) rather than to be applied now. */
  hold(data: unknown): boolean {
    if (this.inFlight.size === 0) return false;
    this.held.push([this.nextTicket, data]);
    return true;
  }

  /** The script of `ticket` replied (null: it failed, or wrote nothing). Returns the held
   * messages to apply now, before the reply, in the order they came: those no script still in
   * flight can have published. The reply's own echo is dropped; when it has not come yet, it is
   * expected. */
  replied(ticket: number, reply: unknown): unknown[] {
    if (!this.inFlight.delete(ticket)) throw new UsageError(`ticket ${ticket} is not a script in flight`);
    if (reply !== null && reply !== undefined && !this.takeHeld(publishedOf(reply))) this.expect(reply);
    const oldest = this.inFlight.values().next();
    const bound = oldest.done ? this.nextTicket : oldest.value;
    let count = 0;
    while (count < this.held.length && (this.held[count] as [number, unknown])[0] <= bound) count++;
    return this.held.splice(0, count).map(([, data]) => data);
  }

  private takeHeld(published: unknown): boolean {
    const key = keyOf(published);
    const index = this.held.findIndex(([, data]) => (key === null ? data === published : keyOf(data) === key));
    if (index < 0) return false;
    this.held.splice(index, 1);
    return true;
  }

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
