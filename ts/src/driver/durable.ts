/** `durability: "replica"` on the wire: a script, then `WAIT <replicas> <ms>`, on one connection in
 * one round trip (WAIT counts the replicas that acknowledged that connection's writes), with the
 * NOSCRIPT fallback to EVAL.
 *
 * WAIT blocks its connection until the replicas answer (up to the timeout while one lags or is
 * gone), and every other call of an instance shares one pipelined connection: each trip takes a
 * connection of its own from a small pool instead. On a cluster that connection is one to the node
 * owning the keys' slot, taken from the client's slot map; MOVED and ASK are followed here (ASK with
 * ASKING on that same connection), since ioredis does not retry a pipeline whose WAIT answered. */

import { type Cluster, Redis, type RedisOptions } from "ioredis";
import type { WaitCommand } from "../core/durability.js";
import { SCRIPT_SHA1, SCRIPT_TEXT } from "../core/scripts.generated.js";
import { slotOf } from "./cluster.js";
import { describe, watched } from "./connections.js";
import { RedisUnreachable, failedInRedis } from "./redisFailure.js";

const REDIRECTIONS = 5; // tries of a script on a cluster whose slot map is changing
const SETTLING = 100; // milliseconds before a try after TRYAGAIN, CLUSTERDOWN or a lost node
const MAX_IDLE = 8; // connections a node's pool keeps between trips
/** Pool connections fail at once rather than reconnect: a broken one is dropped. */
const POOLED: Partial<RedisOptions> = { maxRetriesPerRequest: 0, retryStrategy: () => null };

/** WAIT could not be answered after the script replied (its connection broke): why. */
export class WaitFailed {
  constructor(readonly reason: string) {}
}

interface Trip {
  /** The script's failure, described; null once it replied. */
  error: unknown;
  /** WAIT's answer, or why it has none. */
  answer: unknown;
}

export class DurableScripts {
  /** Idle connections by node ("host:port"; "" for one Redis). */
  private readonly idle = new Map<string, Redis[]>();
  private readonly busy = new Set<Redis>();
  private closed = false;

  constructor(
    private readonly redis: Redis | Cluster,
    private readonly cluster: Cluster | null,
  ) {}

  /** Script `name`, then `wait`. `replied` gets the script's reply as soon as it comes, before
   * WAIT's answer. Resolves to WAIT's answer (a WaitFailed when there is none); rejects with the
   * script's failure, described in an operator's words. */
  async run(name: string, keys: string[], args: string[], wait: WaitCommand, replied: (reply: unknown) => void): Promise<unknown> {
    let node: string | null = null; // on a cluster: where the keys were redirected to
    let asking = false;
    for (let attempt = 1; ; attempt++) {
      const target = this.cluster === null ? "" : (node ?? (await this.owner(keys[0] as string)));
      let trip = await this.trip(target, asking, ["EVALSHA", SCRIPT_SHA1[name] as string, keys.length, ...keys, ...args], wait, replied);
      if (String(trip.error).includes("NOSCRIPT")) {
        // Redis restarted or was flushed: EVAL runs the script and caches it again.
        trip = await this.trip(target, asking, ["EVAL", SCRIPT_TEXT[name] as string, keys.length, ...keys, ...args], wait, replied);
      }
      if (trip.error === null) return trip.answer;
      const redirected = this.cluster === null || this.closed || attempt >= REDIRECTIONS ? null : redirection(trip.error);
      if (redirected === null) throw trip.error;
      [node, asking] = [redirected.node, redirected.asking];
      if (node === null) {
        await new Promise((resolve) => setTimeout(resolve, SETTLING));
        await this.refreshed();
      } else if (!asking) {
        this.cluster?.refreshSlotsCache(); // the client's own map follows too
      }
    }
  }

  /** Drop every connection (a trip on one fails). */
  close(): void {
    this.closed = true;
    for (const connection of [...this.busy, ...[...this.idle.values()].flat()]) connection.disconnect();
    this.busy.clear();
    this.idle.clear();
  }

  private async trip(target: string, asking: boolean, script: (string | number)[], wait: WaitCommand, replied: (reply: unknown) => void): Promise<Trip> {
    const connection = this.take(target);
    let done = false; // the connection may go back to the pool
    let thrown: { exc: unknown } | null = null;
    let failed: (error: unknown) => void = () => {};
    const scriptFailed = new Promise<{ error: unknown }>((resolve) => (failed = (error) => resolve({ error })));
    try {
      const pipeline = connection.pipeline();
      if (asking) pipeline.call("ASKING");
      // The reply goes to the caller as soon as it comes, as on the path without WAIT (a throw
      // inside ioredis's callback would be uncaught: it is kept for after the trip).
      pipeline.call(String(script[0]), ...script.slice(1), (error?: Error | null, reply?: unknown) => {
        if (error) return failed(error);
        try {
          replied(reply);
        } catch (exc) {
          thrown = { exc };
        }
      });
      pipeline.call(...wait);
      const replies = pipeline.exec();
      replies.catch(() => {}); // a failed script does not wait for it (below)
      // A failed script wrote nothing to wait for: its answer comes at once, while WAIT may block
      // up to the timeout (with no replica, even for a connection that wrote nothing). The
      // connection is dropped with the WAIT.
      const first = await Promise.race([replies.then((results) => ({ results: results ?? [] })), scriptFailed]);
      if ("error" in first) return { error: isReply(first.error) ? first.error : new RedisUnreachable(describe(first.error, connection)), answer: null };
      const [waitError, answer] = first.results[asking ? 2 : 1] ?? [new Error("no reply")];
      done = !waitError;
      return { error: null, answer: waitError ? new WaitFailed(describe(waitError, connection)) : answer };
    } catch (exc) {
      if (!failedInRedis(exc)) throw exc; // a bug of ours, not a connection that broke
      return { error: new RedisUnreachable(describe(exc, connection)), answer: null };
    } finally {
      this.give(target, connection, !done);
      if (thrown !== null) throw (thrown as { exc: unknown }).exc;
    }
  }

  private take(target: string): Redis {
    const idle = this.idle.get(target) ?? [];
    let connection = idle.pop();
    while (connection !== undefined && connection.status !== "ready") {
      connection.disconnect();
      connection = idle.pop();
    }
    connection ??= this.open(target);
    this.busy.add(connection);
    return connection;
  }

  private give(target: string, connection: Redis, drop: boolean): void {
    this.busy.delete(connection);
    const idle = this.idle.get(target) ?? [];
    if (drop || this.closed || connection.status !== "ready" || idle.length >= MAX_IDLE) {
      connection.disconnect();
      return;
    }
    idle.push(connection);
    this.idle.set(target, idle);
  }

  private open(target: string): Redis {
    if (this.closed) throw new RedisUnreachable("the connection to Redis closed");
    if (this.cluster === null) return watched((this.redis as Redis).duplicate(POOLED));
    const at = target.lastIndexOf(":");
    const options = { ...this.cluster.options.redisOptions, ...POOLED, host: target.slice(0, at), port: Number(target.slice(at + 1)) };
    return watched(new Redis(options));
  }

  /** The node owning `key`'s slot, as the client's slot map says ("host:port"). */
  private async owner(key: string): Promise<string> {
    const slot = slotOf(key);
    let node = this.cluster?.slots[slot]?.[0];
    if (node === undefined) {
      await this.refreshed();
      node = this.cluster?.slots[slot]?.[0];
    }
    if (node === undefined) throw new RedisUnreachable(`no node of the Redis Cluster serves ${key}`);
    return node;
  }

  private refreshed(): Promise<void> {
    return new Promise((resolve) => this.cluster?.refreshSlotsCache(() => resolve()) ?? resolve());
  }
}

/** An answer Redis gave (a script's error, MOVED...) rather than a failed connection. */
function isReply(error: unknown): boolean {
  return (error as { name?: string } | null)?.name === "ReplyError";
}

/** Where a cluster sends a script that failed: `node` to go to (null: the slot map's owner, once
 * refreshed), with ASKING first or not; null when the failure is the script's own. */
function redirection(error: unknown): { node: string | null; asking: boolean } | null {
  if (!isReply(error)) return { node: null, asking: false }; // a node lost: its replica may take over
  const message = String((error as Error).message);
  const moved = /^(MOVED|ASK) \d+ (\S+)/.exec(message);
  if (moved !== null) return { node: moved[2] as string, asking: moved[1] === "ASK" };
  if (message.startsWith("TRYAGAIN") || message.startsWith("CLUSTERDOWN")) return { node: null, asking: false };
  return null;
}
