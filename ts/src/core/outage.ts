/** How a loop that talks to Redis reports an outage: once when it starts, then at most one
 * reminder a minute, and once when it ends; and how long it waits before trying again
 * (outpost_core/_outage.py). The driver calls failed() after each failure and sleeps for the
 * delay it returns, and succeeded() after each success; each returns the log line to write, if
 * any. Time and the jitter draw come in as data. */

import { backoff } from "./backoff.js";

/** One log line for the driver to write, at a level named as Python's logging names it. */
export interface Report {
  level: ReportLevel;
  message: string;
}

/** The levels of a Report, least severe first. */
export const REPORT_LEVELS = ["debug", "info", "warning", "error"] as const;
export type ReportLevel = (typeof REPORT_LEVELS)[number];

export class Outage {
  /** Consecutive failures of the current outage (0: the peer is answering). */
  failures = 0;
  since = 0;
  remindedAt = 0;
  /** The last error of the outage in progress (null while Redis answers). */
  error: string | null = null;

  constructor(
    /** What the loop does, for the log lines ("the subscriber", "delivery 0"). */
    readonly what: string,
    /** Who does not answer ("Polar" for the WebSocket). */
    readonly peer = "Redis",
    readonly base = 0.05,
    readonly cap = 5.0,
    readonly reminder = 60.0,
  ) {}

  /** Redis failed: the seconds to wait before the next try, and what to log. */
  failed(now: number, error: string, draw: number): [number, Report | null] {
    this.failures += 1;
    this.error = error;
    const delay = backoff(this.failures, this.base, this.cap, draw);
    if (this.failures === 1) {
      this.since = this.remindedAt = now;
      return [delay, { level: "warning", message: `outpost: ${this.peer} unreachable for ${this.what}: ${error}` }];
    }
    if (now - this.remindedAt >= this.reminder) {
      this.remindedAt = now;
      const seconds = (now - this.since).toFixed(0);
      return [delay, { level: "warning", message: `outpost: ${this.peer} still unreachable for ${this.what} after ${seconds} s: ${error}` }];
    }
    return [delay, null];
  }

  /** Redis answered: what to log when that ends an outage. */
  succeeded(now: number): Report | null {
    if (!this.failures) return null;
    const seconds = (now - this.since).toFixed(1);
    this.failures = 0;
    this.error = null;
    return { level: "info", message: `outpost: ${this.peer} is back for ${this.what} after ${seconds} s` };
  }

  get down(): boolean {
    return this.failures > 0;
  }
}
