/** Deadlines by key in a heap: finding what is due costs what is due, not how many keys wait
 * (outpost_core/_deadlines.py). Each key has at most one deadline; replaced and cancelled entries
 * stay in the heap until they surface (then they are skipped), and the heap is rebuilt when such
 * leftovers outnumber the live deadlines. */

type Entry<K> = [when: number, order: number, key: K];

export class Deadlines<K> {
  private readonly due = new Map<K, number>();
  private heap: Entry<K>[] = [];
  private order = 0;

  get size(): number {
    return this.due.size;
  }

  get(key: K): number | undefined {
    return this.due.get(key);
  }

  /** Give key the deadline when (null: none). */
  set(key: K, when: number | null): void {
    if (when === null) {
      this.due.delete(key);
      return;
    }
    if (this.due.get(key) === when) return;
    this.due.set(key, when);
    this.push([when, this.order++, key]);
    if (this.heap.length > 2 * this.due.size + 64) {
      this.heap = [];
      for (const [k, w] of this.due) this.push([w, this.order++, k]);
    }
  }

  cancel(key: K): void {
    this.due.delete(key);
  }

  /** The keys whose deadline is now or earlier, earliest first; they no longer wait. */
  popDue(now: number): K[] {
    const out: K[] = [];
    while (this.heap.length && (this.heap[0] as Entry<K>)[0] <= now) {
      const [when, , key] = this.pop();
      if (this.due.get(key) === when) {
        this.due.delete(key);
        out.push(key);
      }
    }
    return out;
  }

  /** The earliest deadline, or null. */
  next(): number | null {
    while (this.heap.length) {
      const [when, , key] = this.heap[0] as Entry<K>;
      if (this.due.get(key) === when) return when;
      this.pop();
    }
    return null;
  }

  private push(entry: Entry<K>): void {
    const heap = this.heap;
    heap.push(entry);
    let i = heap.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!less(heap[i] as Entry<K>, heap[parent] as Entry<K>)) break;
      [heap[i], heap[parent]] = [heap[parent] as Entry<K>, heap[i] as Entry<K>];
      i = parent;
    }
  }

  private pop(): Entry<K> {
    const heap = this.heap;
    const top = heap[0] as Entry<K>;
    const last = heap.pop() as Entry<K>;
    if (heap.length) {
      heap[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < heap.length && less(heap[l] as Entry<K>, heap[m] as Entry<K>)) m = l;
        if (r < heap.length && less(heap[r] as Entry<K>, heap[m] as Entry<K>)) m = r;
        if (m === i) break;
        [heap[i], heap[m]] = [heap[m] as Entry<K>, heap[i] as Entry<K>];
        i = m;
      }
    }
    return top;
  }
}

function less<K>(a: Entry<K>, b: Entry<K>): boolean {
  return a[0] < b[0] || (a[0] === b[0] && a[1] < b[1]);
}
