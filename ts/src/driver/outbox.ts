/** Reading the outbox streams for a delivery loop: new entries (one blocking read of every stream;
 * on a cluster, one stream at a time), this consumer's pending entries when the recovery says
 * they are to be read again, and the consumer group each stream needs. */

import type { Cluster, Redis } from "ioredis";
import { GROUP, type OutboxRead, type ReadOutbox } from "../core/delivery.js";
import { type DriverContext, POLL } from "./context.js";

const CLUSTER_POLL = 0.05; // seconds an empty round of reads on a cluster waits before the next, at first
const IDLE_DOUBLINGS = 6; // bounds the doubling (50 ms -> 3.2 s); the read's block (0.5 s) caps it first

type Entries = [string, string, Map<string, string>][];

export class OutboxReads {
  /** On a cluster: rounds of outbox reads in a row that found nothing (see readOutboxesOneByOne). */
  private emptyRounds = 0;

  constructor(private readonly ctx: DriverContext) {}

  /** A ReadOutbox: a loop's read, or the one beside its post (the re-read of this consumer's
   * pending entries first, when one is due and no loop holds entries). */
  async readOutbox(action: ReadOutbox, connection: Redis | Cluster): Promise<OutboxRead> {
    const ctx = this.ctx;
    const reread = ctx.recovery.nextRead(ctx.deliveries.every((delivery) => delivery.idle));
    ctx.recovery.readStarted();
    const waiting = reread === "waiting" && action.block > 0;
    let read: OutboxRead;
    try {
      if (reread === "now") return await this.readOwnPending(action.count, connection);
      // Due to re-read while another loop reads or holds entries: read what is there without
      // blocking (a blocking read here would keep that loop from the re-read, each loop in
      // turn), then rest uncounted as reading below, so one finds none reading.
      read = await this.readNew(action.count, waiting ? 0 : action.block, connection);
    } finally {
      ctx.recovery.readEnded();
    }
    if (waiting && !read.entries.length) await ctx.deliveryWake.wait(ctx.deliveryWake.version, Math.min(action.block, POLL));
    return read;
  }

  /** XREADGROUP ... 0: the entries delivered to this consumer and not acknowledged, one stream
   * at a time (a cluster refuses a read across slots). */
  private async readOwnPending(count: number, connection: Redis | Cluster): Promise<OutboxRead> {
    const ctx = this.ctx;
    const client = ctx.cluster ?? connection;
    const xreadgroup = client.xreadgroup.bind(client) as unknown as (...a: (string | number)[]) => Promise<unknown>;
    const entries: Entries = [];
    for (const stream of ctx.outboxes) {
      const reply = (await xreadgroup("GROUP", GROUP, ctx.consumer, "COUNT", count - entries.length, "STREAMS", stream, "0")) as [string, [string, string[] | null][]][] | null;
      for (const [name, listing] of reply ?? []) {
        for (const [id, flat] of listing ?? []) if (Array.isArray(flat)) entries.push([name, id, pairs(flat)]);
      }
      if (entries.length >= count) {
        ctx.recovery.morePending(); // the next read at rest looks again
        break;
      }
    }
    return { kind: "OutboxRead", entries };
  }

  /** XREADGROUP ... >: entries no consumer was given yet, blocking at most `block` seconds. */
  private async readNew(count: number, block: number, connection: Redis | Cluster): Promise<{ kind: "OutboxRead"; entries: Entries }> {
    const ctx = this.ctx;
    if (ctx.cluster !== null) return this.readOutboxesOneByOne(count, block);
    const blockMs = Math.trunc(block * 1000);
    const args: (string | number)[] = ["GROUP", GROUP, ctx.consumer, "COUNT", count];
    if (blockMs > 0) args.push("BLOCK", blockMs);
    args.push("STREAMS", ...ctx.outboxes, ...ctx.outboxes.map(() => ">"));
    // (ioredis's generic call() unwraps a one-stream answer: use the command's own method)
    const xreadgroup = connection.xreadgroup.bind(connection) as unknown as (...a: (string | number)[]) => Promise<unknown>;
    const reply = (await xreadgroup(...args)) as [string, [string, string[] | null][]][] | null;
    const entries: Entries = [];
    for (const [stream, listing] of reply ?? []) {
      for (const [id, flat] of listing ?? []) if (Array.isArray(flat)) entries.push([stream, id, pairs(flat)]);
    }
    return { kind: "OutboxRead", entries };
  }

  /** A cluster refuses one read across slots: each shard's stream is read on its own (up to
   * `count` entries each, as one read of every stream gives on one Redis; starting with a random
   * one, so no shard always goes first), and an empty round waits before the next:
   * 50 ms after entries came, twice as long after each empty round, up to the read's block (an
   * idle instance read every stream 20 times a second). */
  private async readOutboxesOneByOne(count: number, block: number): Promise<{ kind: "OutboxRead"; entries: Entries }> {
    const ctx = this.ctx;
    const entries: Entries = [];
    const outboxes = ctx.outboxes;
    const start = Math.floor(Math.random() * outboxes.length);
    for (let offset = 0; offset < outboxes.length; offset++) {
      const stream = outboxes[(start + offset) % outboxes.length] as string;
      const xreadgroup = ctx.redis.xreadgroup.bind(ctx.redis) as unknown as (...a: (string | number)[]) => Promise<unknown>;
      const reply = (await xreadgroup("GROUP", GROUP, ctx.consumer, "COUNT", count, "STREAMS", stream, ">")) as [string, [string, string[] | null][]][] | null;
      for (const [name, listing] of reply ?? []) {
        for (const [id, flat] of listing ?? []) if (Array.isArray(flat)) entries.push([name, id, pairs(flat)]);
      }
    }
    if (entries.length) {
      this.emptyRounds = 0;
    } else if (block > 0) {
      const idle = CLUSTER_POLL * 2 ** Math.min(this.emptyRounds, IDLE_DOUBLINGS);
      if (block >= idle) this.emptyRounds += 1; // a round asked to block less (a flush's) is not idleness
      await ctx.deliveryWake.wait(ctx.deliveryWake.version, Math.min(block, idle));
    }
    return { kind: "OutboxRead", entries };
  }
}

/** Each outbox stream's consumer group, created where missing (with the stream). */
export async function createGroups(ctx: DriverContext, client: Redis | Cluster): Promise<void> {
  for (const stream of ctx.outboxes) {
    try {
      await client.xgroup("CREATE", stream, GROUP, "0", "MKSTREAM");
    } catch (exc) {
      if (!String(exc).includes("BUSYGROUP")) throw exc;
    }
  }
}

/** A stream entry's flat field list as a map. */
export function pairs(flat: string[]): Map<string, string> {
  const out = new Map<string, string>();
  for (let i = 0; i + 1 < flat.length; i += 2) out.set(flat[i] as string, flat[i + 1] as string);
  return out;
}
