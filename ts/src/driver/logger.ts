/** Where an instance's log lines go (the `logger` option), and how a core report is written to
 * it: the core never logs, it reports lines the driver writes here. */

import type { Report } from "../core/outage.js";

export interface Logger {
  debug(message: string): void;
  warn(message: string): void;
  /** Optional: where the end of an outage is said (debug when absent). */
  info?(message: string): void;
  /** Optional: where what needs an operator is said: a token Polar refuses, delivery stalled, a
   * bug of ours in a loop (warn when absent). */
  error?(message: string): void;
}

/** A line that needs an operator: to `error` where the logger has one, else to `warn`. */
export function logError(log: Logger, message: string): void {
  (log.error ?? log.warn).call(log, message);
}

export function logReport(log: Logger, report: Report | null): void {
  if (report === null) return;
  if (report.level === "error") logError(log, report.message);
  else if (report.level === "warning") log.warn(report.message);
  else if (report.level === "info") (log.info ?? log.debug).call(log, report.message);
  else log.debug(report.message);
}
