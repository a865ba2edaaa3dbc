/** A logger for the tests that read what an instance logged. */

/** A logger that keeps every line, with its level. */
export class Lines {
  readonly lines: { level: string; message: string }[] = [];
  readonly logger = {
    debug: (message: string) => this.lines.push({ level: "debug", message }),
    info: (message: string) => this.lines.push({ level: "info", message }),
    warn: (message: string) => this.lines.push({ level: "warn", message }),
    error: (message: string) => this.lines.push({ level: "error", message }),
  };
  at(level: string): string[] {
    return this.lines.filter((l) => l.level === level).map((l) => l.message);
  }
  get text(): string {
    return this.lines.map((l) => `${l.level} ${l.message}`).join("\n");
  }
}
