/** A real Redis Cluster for the tests (as outpost_emulator/redis_server.py's RedisCluster):
 * `primaries` primaries with `replicas` replicas each, cluster-enabled redis-server processes on
 * free loopback ports, joined by `redis-cli --cluster create`. A short node timeout makes a killed
 * primary's fail-over complete in about a second. */

import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { Redis } from "ioredis";
import { freePort, RedisProcess, waitFor } from "./redisServer.js";

const run = promisify(execFile);
const NODE_TIMEOUT_MS = 200;

class ClusterNode extends RedisProcess {
  constructor(readonly port: number) {
    super("outpost-ts-cluster-");
  }

  start(): void {
    const args = [
      "--port", String(this.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
      "--dir", this.directory, "--loglevel", "warning",
      "--cluster-enabled", "yes", "--cluster-config-file", join(this.directory, "nodes.conf"),
      "--cluster-node-timeout", String(NODE_TIMEOUT_MS),
      // A replica whose primary was down a while still takes over: the tests kill on purpose.
      "--cluster-replica-validity-factor", "0",
      "--repl-diskless-sync-delay", "0",
    ]; // prettier-ignore
    this.spawn(args);
  }

  async stop(): Promise<void> {
    await this.remove("SIGKILL");
  }
}

/** A free port whose cluster bus port (port + 10000) is free too. */
async function freeClusterPort(): Promise<number> {
  for (;;) {
    const port = await freePort();
    if (port + 10000 > 65535) continue;
    return port;
  }
}

async function command(port: number, ...args: (string | number)[]): Promise<unknown> {
  const client = new Redis({ port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null, connectTimeout: 2000 });
  client.on("error", () => {});
  try {
    await client.connect();
    return await client.call(args[0] as string, ...args.slice(1));
  } finally {
    client.disconnect();
  }
}

class PortTaken extends Error {}

export class RedisCluster {
  private readonly nodes: ClusterNode[] = [];

  private constructor() {}

  static async start(primaries = 3, replicas = 1): Promise<RedisCluster> {
    // A port may be taken between the look for a free one and the bind (this machine runs other
    // tests): then start afresh on other ports.
    for (let attempt = 1; ; attempt++) {
      const cluster = await RedisCluster.startOnce(primaries, replicas).catch(async (exc: unknown) => {
        if (attempt >= 3 || !(exc instanceof PortTaken)) throw exc;
        return null;
      });
      if (cluster !== null) return cluster;
    }
  }

  private static async startOnce(primaries: number, replicas: number): Promise<RedisCluster> {
    const cluster = new RedisCluster();
    for (let i = 0; i < primaries * (1 + replicas); i++) cluster.nodes.push(new ClusterNode(await freeClusterPort()));
    for (const node of cluster.nodes) node.start();
    await Promise.all(cluster.nodes.map((node) => waitFor("a cluster node to answer", async () => ((await command(node.port, "INFO", "server").catch(() => null)) as string | null)?.match(/process_id:(\d+)/)?.[1])))
      .then(async (pids) => {
        if (pids.every((pid, i) => Number(pid) === cluster.nodes[i]?.process?.pid)) return;
        await cluster.stop();
        throw new PortTaken("another server answers on a cluster node's port");
      });
    const create = ["--cluster", "create", ...cluster.nodes.map((n) => `127.0.0.1:${n.port}`), "--cluster-replicas", String(replicas), "--cluster-yes"];
    await run("redis-cli", create, { timeout: 60_000 });
    await cluster.waitHealthy();
    return cluster;
  }

  /** The URL the SDKs take for a cluster (any node is a start-up node). */
  get url(): string {
    return `redis+cluster://127.0.0.1:${this.livePorts()[0]}`;
  }

  livePorts(): number[] {
    return this.nodes.filter((n) => n.process !== null).map((n) => n.port);
  }

  /** "first slot, last slot, port of its primary" for every served range, as a live node says. */
  async slotOwners(): Promise<[number, number, number][]> {
    const slots = (await command(this.livePorts()[0] as number, "CLUSTER", "SLOTS")) as [number, number, [string, number]][];
    return slots.map(([start, end, primary]) => [start, end, Number(primary[1])]);
  }

  async primaryPorts(): Promise<number[]> {
    return [...new Set((await this.slotOwners()).map(([, , port]) => port))].sort();
  }

  /** Until every live node says cluster_state:ok, every replica's link is up and every node
   * agrees on who serves every slot. */
  async waitHealthy(seconds = 30): Promise<void> {
    await waitFor("the cluster to be healthy", async () => ((await this.healthy().catch(() => false)) ? true : undefined), seconds);
  }

  private async healthy(): Promise<boolean> {
    const live = new Set(this.livePorts());
    let first: string | null = null;
    for (const port of live) {
      const info = String(await command(port, "CLUSTER", "INFO"));
      if (!info.includes("cluster_state:ok")) return false;
      const replication = String(await command(port, "INFO", "replication"));
      if (replication.includes("role:slave") && !replication.includes("master_link_status:up")) return false;
      const slots = (await command(port, "CLUSTER", "SLOTS")) as [number, number, [string, number]][];
      const view = JSON.stringify(slots.map(([s, e, p]) => [s, e, Number(p[1])]).sort((a, b) => (a[0] as number) - (b[0] as number)));
      const covered = slots.reduce((n, [s, e]) => n + e - s + 1, 0);
      if (covered !== 16384 || slots.some(([, , p]) => !live.has(Number(p[1])))) return false;
      if (first === null) first = view;
      else if (view !== first) return false;
    }
    return first !== null;
  }

  async portForSlot(slot: number): Promise<number> {
    const owner = (await this.slotOwners()).find(([start, end]) => start <= slot && slot <= end);
    if (owner === undefined) throw new Error(`no node serves slot ${slot}`);
    return owner[2];
  }

  /** The ports of the replicas of the primary on `port`, as CLUSTER NODES says (CLUSTER SLOTS
   * leaves out a replica that has no data yet). */
  async replicaPorts(port: number): Promise<number[]> {
    const id = await this.nodeId(port);
    const lines = String(await command(this.livePorts()[0] as number, "CLUSTER", "NODES")).split("\n");
    // <id> <ip:port@bus> <flags> <primary id> ...
    return lines.map((line) => line.split(" ")).filter((fields) => fields[3] === id && fields[2]?.includes("slave")).map((fields) => Number(/:(\d+)@/.exec(fields[1] ?? "")?.[1]));
  }

  async nodeId(port: number): Promise<string> {
    return String(await command(port, "CLUSTER", "MYID"));
  }

  /** Marks `slot` as leaving its primary for `toPort` (IMPORTING on the target, MIGRATING on the
   * source): its keys are still served by the source, new keys go to the target (ASK). */
  async beginMigration(slot: number, toPort: number): Promise<void> {
    const source = await this.portForSlot(slot);
    await command(toPort, "CLUSTER", "SETSLOT", slot, "IMPORTING", await this.nodeId(source));
    await command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", await this.nodeId(toPort));
  }

  /** MIGRATE every key of `slot` to the target: the source answers ASK for them. */
  async moveKeys(slot: number, toPort: number): Promise<void> {
    const source = await this.portForSlot(slot);
    for (;;) {
      const keys = (await command(source, "CLUSTER", "GETKEYSINSLOT", slot, 100)) as string[];
      if (!keys.length) break;
      await command(source, "MIGRATE", "127.0.0.1", toPort, "", 0, 5000, "KEYS", ...keys);
    }
  }

  /** Gives `slot` to the target (SETSLOT NODE on the target, the source, then every other
   * primary), and waits until every node agrees. */
  async endMigration(slot: number, toPort: number): Promise<void> {
    const source = await this.portForSlot(slot);
    const targetId = await this.nodeId(toPort);
    await command(toPort, "CLUSTER", "SETSLOT", slot, "NODE", targetId);
    await command(source, "CLUSTER", "SETSLOT", slot, "NODE", targetId);
    for (const port of await this.primaryPorts()) {
      if (port !== toPort && port !== source) await command(port, "CLUSTER", "SETSLOT", slot, "NODE", targetId);
    }
    await this.waitHealthy();
  }

  /** SIGKILL the node on `port`; its replica takes over after the node timeout. */
  kill(port: number): void {
    this.nodes.find((n) => n.port === port)?.kill();
  }

  async stop(): Promise<void> {
    await Promise.all(this.nodes.map((n) => n.stop()));
  }
}
