/** Real redis-server processes for the tests, on free ports (as tests/support/redis_server.py). */

import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Redis } from "ioredis";
import { signalAndWait } from "./childProcess.js";

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

/** One redis-server child process (`process`: null while none runs) and the directory it keeps
 * its files in. */
export class RedisProcess {
  process: ChildProcess | null = null;
  readonly directory: string;

  constructor(directoryPrefix: string) {
    this.directory = mkdtempSync(join(tmpdir(), directoryPrefix));
  }

  protected spawn(args: string[]): ChildProcess {
    this.process = spawn("redis-server", args, { stdio: "ignore" });
    return this.process;
  }

  /** SIGKILL: connections reset. */
  kill(): void {
    this.process?.kill("SIGKILL");
    this.process = null;
  }

  /** Send `signal` and wait for the exit, keeping the directory (a durable server's data). */
  async halt(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    const process = this.process;
    this.process = null;
    await signalAndWait(process, signal);
  }

  /** Halt with `signal`, then remove the directory. */
  protected async remove(signal: NodeJS.Signals): Promise<void> {
    await this.halt(signal);
    rmSync(this.directory, { recursive: true, force: true });
  }
}

export class RedisServer extends RedisProcess {
  port = 0;
  private readonly clients: Redis[] = [];

  /** durable: an append-only file written at every command, so a restart keeps the data. */
  constructor(readonly durable = false) {
    super("outpost-ts-redis-");
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}/0`;
  }

  static async start(durable = false): Promise<RedisServer> {
    const server = new RedisServer(durable);
    await server.start();
    return server;
  }

  async start(): Promise<void> {
    // The port may be taken between the look for a free one and the bind (this machine runs
    // other tests): the server that answers must be this process.
    for (let attempt = 1; ; attempt++) {
      const fresh = !this.port;
      if (fresh) this.port = await freePort();
      if (await this.startOnce()) return;
      this.kill();
      if (!fresh || attempt >= 3) throw new Error(`another server answers on port ${this.port}`);
      this.port = 0;
    }
  }

  /** Whether the redis-server started here is the one answering on the port. */
  private async startOnce(): Promise<boolean> {
    const args = ["--port", String(this.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", this.durable ? "yes" : "no", "--appendfsync", "always", "--dir", this.directory, "--loglevel", "warning", ...this.extraArgs()];
    const child = this.spawn(args);
    const probe = new Redis({ port: this.port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on("error", () => {});
    try {
      const pid = await waitFor("redis-server to answer", async () => {
        try {
          if (probe.status !== "ready") await probe.connect();
          const info = await probe.info("server");
          return /process_id:(\d+)/.exec(info)?.[1];
        } catch {
          probe.disconnect();
          return undefined;
        }
      });
      return Number(pid) === child.pid;
    } finally {
      probe.disconnect();
    }
  }

  /** More redis-server arguments (a replica's). */
  protected extraArgs(): string[] {
    return [];
  }

  /** A plain client, closed with the server. */
  client(): Redis {
    const client = new Redis({ port: this.port, maxRetriesPerRequest: 1 });
    client.on("error", () => {});
    this.clients.push(client);
    return client;
  }

  async stop(): Promise<void> {
    for (const client of this.clients.splice(0)) client.disconnect();
    await this.remove("SIGTERM");
  }
}
