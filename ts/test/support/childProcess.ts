/** Stopping the servers the tests start as child processes. */

import type { ChildProcess } from "node:child_process";

/** Send `signal` to `child` unless it has exited already, and wait for it to exit. */
export async function signalAndWait(child: ChildProcess | null, signal: NodeJS.Signals): Promise<void> {
  if (child === null || child.exitCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill(signal);
  await exited;
}
