/** Redis Cluster: which URL names one, which slot a key hashes to, and the sharded subscription
 * of the change channels, each on the node that owns its slot now.
 *
 * A cluster's sharded subscription lives on one node per slot, and no client follows a
 * fail-over or a slot migration by itself: this looks at the client's slot map after a break and
 * every second, and moves each channel to its owner. A channel stops counting as followed as soon
 * as its node breaks or gives the slot away (the core's copies of that shard then read Redis),
 * and counts again once its new owner confirmed it (the copies reload, then follow). Which node
 * holds which channel is the core's ChannelPlacement's to decide: this feeds it what the slot map
 * and the node connections say, and runs what it asks. */

import { type Cluster, Redis } from "ioredis";
import { ChannelPlacement } from "../core/placement.js";

/** For `redis+cluster://host:port` (`rediss+cluster://` with TLS), which names a cluster by any of
 * its nodes, that node's plain URL; null for the URL of one Redis. */
export function clusterNodeUrl(url: string): string | null {
  const at = url.indexOf("://");
  if (at < 0) return null;
  const scheme = url.slice(0, at);
  return scheme.endsWith("+cluster") ? `${scheme.slice(0, -"+cluster".length)}${url.slice(at)}` : null;
}

/** The cluster slot of a key: CRC16 (XMODEM) of its hash tag (the part in the first {...}, when
 * not empty), or of the whole key, modulo 16384. */
export function slotOf(key: string): number {
  const bytes = Buffer.from(key, "utf8");
  let start = 0;
  let end = bytes.length;
  const open = bytes.indexOf(0x7b); // "{"
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1); // "}"
    if (close > open + 1) {
      start = open + 1;
      end = close;
    }
  }
  let crc = 0;
  for (let i = start; i < end; i++) {
    crc ^= (bytes[i] as number) << 8;
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}

export interface SubscriptionEvents {
  /** The owner of `channel` confirmed its subscription. */
  confirmed(channel: string): void;
  /** These channels are followed no more (their node broke, or gave their slot away). */
  lost(channels: string[]): void;
  message(data: string): void;
  /** A node or the slot map failed; returns the seconds to wait before looking again. */
  failed(exc: unknown, node: string | null): number;
}

interface NodeSubscription {
  client: Redis;
  /** Closed on purpose: it holds no channel any more. */
  retired: boolean;
}

const TOPOLOGY_CHECK = 1.0; // seconds between two looks at the slot map
const AFTER_BREAK = 0.05; // seconds before the first look after a break

export class ClusterSubscriptions {
  private readonly nodes = new Map<string, NodeSubscription>();
  private readonly placement: ChannelPlacement;
  private timer: NodeJS.Timeout | null = null;
  private following = false;
  private again = false;
  private stopped = false;

  constructor(
    private readonly cluster: Cluster,
    private readonly channels: readonly string[],
    private readonly events: SubscriptionEvents,
  ) {
    this.placement = new ChannelPlacement(channels);
  }

  start(): void {
    this.lookIn(0);
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== null) clearTimeout(this.timer);
    for (const node of this.nodes.values()) node.client.disconnect();
    this.nodes.clear();
  }

  private lookIn(seconds: number): void {
    if (this.stopped) return;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.follow();
    }, seconds * 1000);
  }

  /** Refresh the slot map, then hand each channel to the node that owns its slot. */
  private async follow(): Promise<void> {
    if (this.following) {
      this.again = true;
      return;
    }
    this.following = true;
    let next = TOPOLOGY_CHECK;
    try {
      await new Promise<void>((resolve, reject) => this.cluster.refreshSlotsCache((error) => (error ? reject(error) : resolve())));
      if (this.stopped) return;
      this.place();
    } catch (exc) {
      next = Math.min(TOPOLOGY_CHECK, this.events.failed(exc, null));
    } finally {
      this.following = false;
    }
    if (this.again) {
      this.again = false;
      next = AFTER_BREAK;
    }
    this.lookIn(next);
  }

  private place(): void {
    const owners = new Map(this.channels.map((channel) => [channel, this.cluster.slots[slotOf(channel)]?.[0] ?? null]));
    this.placement.handle({ kind: "SlotMapRead", owners });
    this.run();
  }

  /** Do what the placement asks, in order. */
  private run(): void {
    for (const effect of this.placement.effects()) {
      switch (effect.kind) {
        case "SubscribeOnNode":
          this.subscribe(effect.node, effect.channel);
          break;
        case "UnsubscribeOnNode":
          // A break of this node is its close handler's.
          this.nodes.get(effect.node)?.client.sunsubscribe(...effect.channels).catch(() => {});
          break;
        case "RetireNode": {
          // Every slot it served went elsewhere: its connection is no longer needed.
          const node = this.nodes.get(effect.node);
          if (node === undefined) break;
          node.retired = true;
          this.nodes.delete(effect.node);
          node.client.disconnect();
          break;
        }
        case "ChannelsLost":
          this.events.lost(effect.channels);
          break;
        case "ChannelSubscribed":
          this.events.confirmed(effect.channel);
          break;
        default: {
          const unhandled: never = effect; // a placement effect without a case fails to compile
          throw new Error(`no case for ${JSON.stringify(unhandled)}`);
        }
      }
    }
  }

  private subscribe(owner: string, channel: string): void {
    const node = this.nodes.get(owner) ?? this.open(owner);
    // An answer from a connection dropped since (its node is another connection now, or none)
    // says nothing of the channel's placement.
    node.client.ssubscribe(channel).then(
      () => {
        if (this.nodes.get(owner) !== node) return;
        this.placement.handle({ kind: "NodeConfirmed", node: owner, channel });
        this.run();
      },
      (exc: unknown) => {
        // Refused (a MOVED from a stale slot map) or the connection broke (its close handler
        // says so): the channel is placed again at the next look at the slot map.
        if (this.nodes.get(owner) !== node || !this.placement.heldBy(owner, channel)) return;
        this.placement.handle({ kind: "NodeGaveUp", node: owner, channels: [channel] });
        this.run();
        this.lookIn(Math.min(this.events.failed(exc, owner), TOPOLOGY_CHECK));
      },
    );
  }

  /** A subscriber connection to one node; it is dropped, not reconnected, when it breaks (the
   * slot map then says where its channels went). */
  private open(name: string): NodeSubscription {
    const split = name.lastIndexOf(":");
    const template = this.cluster.options.redisOptions ?? {};
    const client = new Redis({
      ...template,
      host: name.slice(0, split),
      port: Number(name.slice(split + 1)),
      autoResubscribe: false,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
      lazyConnect: false,
    });
    const node: NodeSubscription = { client, retired: false };
    this.nodes.set(name, node);
    let broken = false;
    const drop = (exc: unknown) => {
      if (broken || node.retired) return;
      broken = true;
      const current = this.nodes.get(name) === node;
      if (current) this.nodes.delete(name);
      client.disconnect();
      if (this.stopped) return;
      if (current) {
        this.placement.handle({ kind: "NodeBroke", node: name });
        this.run();
      }
      const wait = exc === null ? AFTER_BREAK : this.events.failed(exc, name);
      if (this.following) this.again = true;
      else this.lookIn(Math.min(wait, TOPOLOGY_CHECK));
    };
    client.on("error", (exc: unknown) => drop(exc));
    client.on("close", () => drop(null));
    client.on("smessage", (_channel: string, message: string) => this.events.message(message));
    // Redis tells a subscriber when a migration took one of its channels' slots away (ioredis
    // says "moved", without the channel): this node's channels count as lost until each is
    // confirmed again, on this node or on the slot's new owner.
    client.on("moved", () => {
      if (broken || this.stopped || this.nodes.get(name) !== node) return;
      this.placement.handle({ kind: "NodeGaveUp", node: name });
      this.run();
      if (this.following) this.again = true;
      else this.lookIn(0);
    });
    return node;
  }
}
