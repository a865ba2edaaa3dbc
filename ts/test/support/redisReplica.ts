/** A replica of one RedisServer (`--replicaof`), for `durability: "replica"` (as
 * tests/support/redis_cluster.py's RedisReplica). */

import { Redis } from "ioredis";
import { RedisServer, waitFor } from "./redisServer.js";

export class RedisReplica extends RedisServer {
  constructor(readonly primary: RedisServer) {
    super();
  }

  /** A replica of `primary`, started, and in sync with it (WAIT counts it from then on). */
  static async of(primary: RedisServer): Promise<RedisReplica> {
    const replica = new RedisReplica(primary);
    await replica.start();
    await replica.inSync();
    return replica;
  }

  protected override extraArgs(): string[] {
    return ["--replicaof", "127.0.0.1", String(this.primary.port)];
  }

  override async start(): Promise<void> {
    // The primary's first full sync would wait 5 s for more replicas to share it.
    await this.onPrimary((client) => client.config("SET", "repl-diskless-sync-delay", "0"));
    await super.start();
  }

  /** Until the primary counts this replica as online. */
  async inSync(seconds = 10): Promise<void> {
    await waitFor("the replica to come in sync", () => this.onPrimary(async (client) => (/slave0:[^\r\n]*state=online/.test(await client.info("replication")) ? true : undefined)), seconds);
  }

  private async onPrimary<T>(call: (client: Redis) => Promise<T>): Promise<T> {
    const client = new Redis({ port: this.primary.port, maxRetriesPerRequest: 0, retryStrategy: () => null });
    client.on("error", () => {});
    try {
      return await call(client);
    } finally {
      client.disconnect();
    }
  }
}
