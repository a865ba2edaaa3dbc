/** The log lines a machine of the core holds for its driver: the core never logs, it reports
 * (outpost_core/_reports.py). A driver drains them after each input it hands over and logs each
 * line. A machine nobody drains must not grow for ever: Reports keeps the newest lines only,
 * counts the ones it lets go, and says so first in the next drain. */

import { REPORT_LEVELS, type Report, type ReportLevel } from "./outage.js";

/** The most lines held between two drains (letting go of 16,000 idle customers at once is one
 * debug line each: the oldest go, counted). */
export const KEPT = 1000;

export class Reports {
  private lines: Report[] = [];
  private dropped = 0;
  private droppedLevel: ReportLevel = "debug";

  constructor(private readonly kept = KEPT) {}

  add(level: ReportLevel, message: string): void {
    this.relay({ level, message });
  }

  /** Hold a line another part of the core made (null: nothing to say). */
  relay(report: Report | null): void {
    if (report === null) return;
    if (this.lines.length >= this.kept) {
      const oldest = this.lines.shift() as Report; // (full: never empty)
      this.dropped += 1;
      if (REPORT_LEVELS.indexOf(oldest.level) > REPORT_LEVELS.indexOf(this.droppedLevel)) this.droppedLevel = oldest.level;
    }
    this.lines.push(report);
  }

  /** The lines held, oldest first; first, when some were let go, how many (at the level of the
   * most severe of them: dropped debug lines are no warning). */
  drain(): Report[] {
    if (this.lines.length === 0) return []; // (a drop leaves the queue full: nothing held, nothing dropped)
    const out = this.lines;
    this.lines = [];
    if (this.dropped) {
      out.unshift({ level: this.droppedLevel, message: `outpost let go of ${this.dropped} older log lines no one collected in time` });
      this.dropped = 0;
      this.droppedLevel = "debug";
    }
    return out;
  }
}
