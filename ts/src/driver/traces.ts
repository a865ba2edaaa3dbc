/** Writing conformance traces (opt-in, `recordTo`): the core records, this file writes. The same
 * files as the Python SDK's `record_to`, replayable by either core. */

import { randomInt } from "node:crypto";
import { type WriteStream, createWriteStream, mkdirSync } from "node:fs";
import { join } from "node:path";
import type { Delivery, DeliverySettings } from "../core/delivery.js";
import { PythonRandom, type Random } from "../core/random.js";
import type { Session, Settings } from "../core/session.js";
import { type Record_, header, recordDelivery, recordSession } from "../core/trace.js";

export class Traces {
  private readonly seed = randomInt(2 ** 32);
  private readonly files: WriteStream[] = [];

  constructor(private readonly directory: string | null) {
    if (directory !== null) mkdirSync(directory, { recursive: true });
  }

  /** The generator of one machine: seeded like Python's random.Random, the seed in its header. */
  rng(stream: number): Random {
    return this.directory === null ? { random: Math.random } : new PythonRandom(this.seed + stream);
  }

  session(session: Session, settings: Settings, serverUrl: string | null): Session {
    if (this.directory === null) return session;
    return recordSession(session, this.open("session.jsonl", header("session", "Settings", settings, this.seed, { server_url: serverUrl })));
  }

  delivery(n: number, delivery: Delivery, settings: DeliverySettings, started: number): Delivery {
    if (this.directory === null) return delivery;
    const head = header("delivery", "DeliverySettings", settings, this.seed + n + 1, { started_at: started });
    return recordDelivery(delivery, this.open(`delivery-${n}.jsonl`, head));
  }

  private open(name: string, head: Record_): (record: Record_) => void {
    const file = createWriteStream(join(this.directory as string, name), { encoding: "utf-8" });
    this.files.push(file);
    const sink = (record: Record_) => void file.write(JSON.stringify(record) + "\n");
    sink(head);
    return sink;
  }

  async close(): Promise<void> {
    await Promise.all(this.files.splice(0).map((file) => new Promise((resolve) => file.end(resolve))));
  }
}
