import { setTimeout as delay } from "node:timers/promises";

/** Wait until `check` holds, looking again every few milliseconds, up to `timeout` seconds. */
export async function eventually(check: () => Promise<boolean> | boolean, what = "condition", timeout = 10): Promise<void> {
  const deadline = Date.now() + timeout * 1000;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`${what} did not hold within ${timeout} s`);
    await delay(5);
  }
}

let counter = 0;
/** A customer id no other test uses. */
export function uniqueCustomer(prefix = "c"): string {
  counter += 1;
  return `${prefix}-${process.pid}-${counter}-${Math.random().toString(36).slice(2, 8)}`;
}
