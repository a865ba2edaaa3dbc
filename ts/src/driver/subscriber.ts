/** The change subscription: every shard's change channel followed, each message handed to the
 * core (effects.ts's heard()); after any (re)subscription the core reloads its copies. On a
 * single Redis one sharded subscription; on a cluster one per node (cluster.ts). */

import type { Cluster, Redis } from "ioredis";
import { ClusterSubscriptions } from "./cluster.js";
import { watched } from "./connections.js";
import type { DriverContext } from "./context.js";
import type { SessionEffects } from "./effects.js";
import { failedInRedis } from "./redisFailure.js";
import { RESTART_CAP_S } from "./supervisor.js";

export class Subscriber {
  private subscriber: Redis | null = null;
  private clusterSubscriptions: ClusterSubscriptions | null = null;

  constructor(
    private readonly ctx: DriverContext,
    private readonly effects: SessionEffects,
  ) {}

  /** Follow every shard's change channel; after any (re)subscription, reload the copies. */
  start(): void {
    const ctx = this.ctx;
    if (ctx.cluster !== null) return this.subscribeToCluster(ctx.cluster);
    const subscriber = watched((ctx.redis as Redis).duplicate({ autoResubscribe: false, maxRetriesPerRequest: null }));
    this.subscriber = subscriber;
    // Each failed attempt counts; the outage says so once, then once a minute.
    subscriber.on("error", (exc: unknown) => {
      if (!ctx.closed) ctx.redisFailed(ctx.subscriberOutage, exc, subscriber);
    });
    subscriber.on("close", () => {
      if (!ctx.closed) ctx.recovery.failedElsewhere(); // a dropped connection: delivery re-reads its pending entries
      // Until Redis confirms the subscription again, no copy follows it: reads go to Redis.
      if (ctx.core.subscribed) this.effects.feed({ kind: "SubscriberLost" });
    });
    subscriber.on("smessage", (_channel: string, message: string) => this.effects.heard(message));
    subscriber.on("ready", () => {
      subscriber.ssubscribe(...ctx.channels).then(
        (count) => {
          if (ctx.closed) return;
          // ioredis resolves once Redis confirmed every channel: the last confirmation's count.
          this.effects.feed({ kind: "SubscriptionConfirmed", count: Number(count) });
          if (ctx.core.subscribed) ctx.redisAnswered(ctx.subscriberOutage);
        },
        (exc: unknown) => {
          if (!ctx.closed) ctx.redisFailed(ctx.subscriberOutage, exc, subscriber);
        },
      );
    });
  }

  /** Unsubscribe for good (the instance closes). */
  stop(): void {
    this.subscriber?.disconnect();
    this.clusterSubscriptions?.stop();
  }

  /** One sharded subscription per node, for the channels whose slots it owns now; a break or a
   * move loses only that node's channels (their shards' copies read Redis until confirmed again
   * on the new owner), the other shards' copies keep following. */
  private subscribeToCluster(cluster: Cluster): void {
    const ctx = this.ctx;
    const subscriptions = new ClusterSubscriptions(cluster, ctx.channels, {
      confirmed: (channel) => {
        if (ctx.closed) return;
        this.effects.feed({ kind: "ChannelSubscribed", channel });
        if (ctx.core.subscribed) ctx.redisAnswered(ctx.subscriberOutage);
      },
      lost: (channels) => {
        if (!ctx.closed) this.effects.feed({ kind: "ChannelsLost", channels });
      },
      message: (data) => this.effects.heard(data),
      failed: (exc) => {
        if (ctx.closed) return 1;
        if (failedInRedis(exc)) return ctx.redisFailed(ctx.subscriberOutage, exc);
        ctx.bug("following the Redis Cluster's slot map", exc); // not an outage: looked at again later
        return RESTART_CAP_S;
      },
    });
    this.clusterSubscriptions = subscriptions;
    subscriptions.start();
  }
}
