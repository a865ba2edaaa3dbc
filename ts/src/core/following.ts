/** Which customers a process follows, by recency of their last read; and a pace for bulk work
 * (outpost_core/_following.py). Reads come without a clock: a read moves its customer to the
 * recent end at once, and the next Tick stamps the customers read since the previous one with its
 * time. Customers are keyed by tag. */

export class Following<C> {
  /** Tag → [customer, when last read]; a Map iterates in insertion order: least recent first. */
  private readonly last = new Map<string, [C, number]>();
  private readonly touched = new Set<string>();
  /** Customers whose last read did not answer yet: not let go before this time. */
  private readonly reading = new Map<string, number>();
  /** The same for reads since the last stamp: for how long, from the stamp. */
  private readonly waits = new Map<string, number>();

  get size(): number {
    return this.last.size;
  }

  has(tag: string): boolean {
    return this.last.has(tag);
  }

  add(tag: string, customer: C, now: number): void {
    this.last.set(tag, [customer, now]);
    this.touched.add(tag);
  }

  /** The customer is read now. */
  touch(tag: string): void {
    const entry = this.last.get(tag) as [C, number];
    this.last.delete(tag);
    this.last.set(tag, entry);
    this.touched.add(tag);
  }

  /** Date the reads since the last stamp now. */
  stamp(now: number): void {
    for (const tag of this.touched) (this.last.get(tag) as [C, number])[1] = now; // (drop clears both)
    this.touched.clear();
    for (const [tag, wait] of this.waits) this.reading.set(tag, now + wait);
    this.waits.clear();
  }

  /** A read of the customer waits for its answer, for up to wait seconds. */
  waiting(tag: string, wait: number): void {
    this.waits.set(tag, wait);
  }

  answered(tag: string): void {
    this.reading.delete(tag);
    this.waits.delete(tag);
  }

  /** Whether a read of the customer may still be waiting for its answer. */
  pinned(tag: string, now: number): boolean {
    return this.waits.has(tag) || (this.reading.get(tag) ?? now) > now;
  }

  oldest(): [string, C, number] | null {
    for (const [tag, [customer, last]] of this.last) return [tag, customer, last];
    return null;
  }

  drop(tag: string): void {
    this.last.delete(tag);
    this.touched.delete(tag);
    this.answered(tag);
  }

  /** The customers read at since or later (or since the last stamp), most recent first. */
  recent(since: number): C[] {
    const out: C[] = [];
    const entries = [...this.last.entries()];
    for (let i = entries.length - 1; i >= 0; i--) {
      const [tag, [customer, last]] = entries[i] as [string, [C, number]];
      if (!this.touched.has(tag) && last < since) break;
      out.push(customer);
    }
    return out;
  }
}

/** At most rate a second, in bursts of up to one second's worth (at least one). */
export class Pacer {
  private readonly burst: number;
  private tokens: number;
  private at: number | null = null;

  constructor(readonly rate: number) {
    this.burst = Math.max(rate, 1);
    this.tokens = this.burst;
  }

  /** How many of wanted may go now (they are spent). */
  take(now: number, wanted: number): number {
    if (this.at !== null) this.tokens = Math.min(this.burst, this.tokens + (now - this.at) * this.rate);
    this.at = now;
    const granted = Math.min(wanted, Math.floor(this.tokens));
    this.tokens -= granted;
    return granted;
  }

  /** When at least one more may go. */
  nextAt(now: number): number {
    if (this.at === null || this.tokens >= 1) return now;
    return this.at + (1 - this.tokens) / this.rate;
  }
}
