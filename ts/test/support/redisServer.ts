/** Real redis-server processes for the tests, on free ports (as tests/support/redis_server.py). */

import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Redis } from "ioredis";

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

export async function waitFor<T>(what: string, probe: () => Promise<T | undefined> | T | undefined, seconds = 10): Promise<T> {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setImmediate(resolve));
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

export class RedisServer {
  port = 0;
  private process: ChildProcess | null = null;
  private readonly directory = mkdtempSync(join(tmpdir(), "outpost-ts-redis-"));
  private readonly clients: Redis[] = [];

  get url(): string {
    return `redis://127.0.0.1:${this.port}/0`;
  }

  static async start(): Promise<RedisServer> {
    const server = new RedisServer();
    await server.start();
    return server;
  }

  async start(): Promise<void> {
    if (!this.port) this.port = await freePort();
    const args = ["--port", String(this.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", this.directory, "--loglevel", "warning"];
    this.process = spawn("redis-server", args, { stdio: "ignore" });
    const probe = new Redis({ port: this.port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on("error", () => {});
    try {
      await waitFor("redis-server to answer PING", async () => {
        try {
          if (probe.status !== "ready") await probe.connect();
          return (await probe.ping()) === "PONG" ? true : undefined;
        } catch {
          probe.disconnect();
          return undefined;
        }
      });
    } finally {
      probe.disconnect();
    }
  }

  /** A plain client, closed with the server. */
  client(): Redis {
    const client = new Redis({ port: this.port, maxRetriesPerRequest: 1 });
    client.on("error", () => {});
    this.clients.push(client);
    return client;
  }

  /** SIGKILL: connections reset. */
  kill(): void {
    this.process?.kill("SIGKILL");
    this.process = null;
  }

  async stop(): Promise<void> {
    for (const client of this.clients.splice(0)) client.disconnect();
    const process = this.process;
    this.process = null;
    if (process !== null && process.exitCode === null) {
      const exited = new Promise((resolve) => process.once("exit", resolve));
      process.kill("SIGTERM");
      await exited;
    }
    rmSync(this.directory, { recursive: true, force: true });
  }
}
