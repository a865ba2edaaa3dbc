/** A version counter that wakes its waiters: a waiter notes the version, checks its condition,
 * then waits for a change after that version (so no wake-up between the two is missed). */
export class Signal {
  version = 0;
  private waiters = new Set<() => void>();

  fire(): void {
    this.version += 1;
    const waiters = this.waiters;
    this.waiters = new Set();
    for (const wake of waiters) wake();
  }

  /** Resolve once the version moved past `version`, or after `seconds`. */
  wait(version: number, seconds: number): Promise<void> {
    if (this.version !== version) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(done, Math.max(0, seconds * 1000));
      const waiters = this.waiters;
      function done(): void {
        clearTimeout(timer);
        waiters.delete(done);
        resolve();
      }
      waiters.add(done);
    });
  }
}

export const sleep = (seconds: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, seconds * 1000));

/** Monotonic seconds. */
export const monotonic = (): number => performance.now() / 1000;

/** The wall clock in microseconds since the epoch. */
export const wallUs = (): number => Math.round((performance.timeOrigin + performance.now()) * 1000);
