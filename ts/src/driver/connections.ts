/** The driver's Redis connections, and what their failures are called. A failure names its cause
 * in the words an operator searches for ("connection refused (nothing listens there)"), the
 * same words as the Python SDK, never the client library's own option names. */

import { Cluster, Redis, type RedisOptions } from "ioredis";
import { ConfigurationError, RedisUnavailable } from "../core/errors.js";
import { clusterNodeUrl } from "./cluster.js";
import { scrub } from "./redact.js";
import { CONNECTION_CLOSED, NOT_WRITEABLE, RedisUnreachable, failedInRedis } from "./redisFailure.js";

/** Seconds a connection attempt to Redis may take before it counts as failed. */
export const CONNECT_TIMEOUT = 10;
/** Most milliseconds between two reconnection attempts of a connection to a Redis that is down:
 * a call made meanwhile fails at once with the last attempt's error, and one made after Redis
 * came back waits at most this long. */
const RECONNECT_CAP_MS = 1000;

/** Why each connection's last attempt to connect failed (cleared once it is ready). */
const lastFailure = new WeakMap<Redis | Cluster, string>();

/** Options of every connection the driver opens itself: a command fails with the connection's
 * first failed attempt rather than after several (its cause is then named by describe()). */
export const OWN_OPTIONS: RedisOptions = {
  connectTimeout: CONNECT_TIMEOUT * 1000,
  maxRetriesPerRequest: 0,
  retryStrategy: (times: number) => Math.min(times * 50, RECONNECT_CAP_MS),
};

/** The client the driver makes for itself from a redis URL (a Redis Cluster's for
 * `redis+cluster://`). */
export function ownClient(url: string): Redis | Cluster {
  checkScheme(url);
  const node = clusterNodeUrl(url);
  if (node === null) return watched(new Redis(url, OWN_OPTIONS));
  const { hostname, port, username, password, protocol } = new URL(node);
  const redisOptions: RedisOptions = { connectTimeout: CONNECT_TIMEOUT * 1000 };
  if (username) redisOptions.username = decodeURIComponent(username);
  if (password) redisOptions.password = decodeURIComponent(password);
  if (protocol === "rediss:") redisOptions.tls = { servername: hostname };
  const cluster = new Cluster([{ host: hostname, port: Number(port || 6379) }], {
    redisOptions,
    // A fail-over answers with MOVED or a refused connection for about a second: keep trying.
    retryDelayOnFailover: 100,
    retryDelayOnClusterDown: 100,
    clusterRetryStrategy: (times: number) => Math.min(times * 50, RECONNECT_CAP_MS),
  });
  return watched(cluster);
}

const SCHEMES = ["redis", "rediss", "redis+cluster", "rediss+cluster"];

/** A URL whose scheme names no Redis is the caller's mistake, said at once (without the URL,
 * which may hold a password) rather than a connection to whatever it points at. */
function checkScheme(url: string): void {
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):\/\//.exec(url)?.[1]?.toLowerCase();
  if (scheme === undefined || !SCHEMES.includes(scheme)) {
    const known = SCHEMES.map((s) => `${s}://`).join(", ");
    throw new ConfigurationError(`redis_url: Redis URL must specify one of the following schemes (${known})`);
  }
}

export function isCluster(client: Redis | Cluster): client is Cluster {
  return client instanceof Cluster || (client as { isCluster?: boolean }).isCluster === true;
}

/** `send()`, with `client`'s socket corked meanwhile: the commands it sends before its first
 * await go out in one write once it returned (one system call, and Redis reads them together),
 * in the order sent, each with its own reply. On a cluster (commands go to several nodes), or a
 * connection not ready (ioredis queues the commands), it is send() as it is. */
export function together<T>(client: Redis | Cluster, send: () => T): T {
  const stream = isCluster(client) || client.status !== "ready" ? null : (client as Redis).stream;
  if (!stream?.writable) return send();
  stream.cork();
  try {
    return send();
  } finally {
    stream.uncork();
  }
}

/** Remember why `client` could not connect, for describe(); an error listener also keeps a
 * failing connection from being an unhandled "error" event (each failed command reports it). */
export function watched<C extends Redis | Cluster>(client: C): C {
  client.on("error", (exc: unknown) => {
    if (client.status !== "ready") lastFailure.set(client, cannotConnect(exc, hostOf(client), portOf(client)));
  });
  client.on("ready", () => lastFailure.delete(client));
  return client;
}

/** Why a call on `client` cannot be sent right now: it is reconnecting after a failed attempt
 * (then a call fails at once, as it would on a fresh connection), or null. */
export function unreachable(client: Redis | Cluster): string | null {
  if (client.status !== "reconnecting" && client.status !== "connecting") return null;
  return lastFailure.get(client) ?? null;
}

/** What went wrong with a Redis call, in an operator's words (a URL it quotes without its
 * password). */
export function describe(exc: unknown, client: Redis | Cluster | null = null): string {
  return scrub(describeRaw(exc, client), []);
}

function describeRaw(exc: unknown, client: Redis | Cluster | null): string {
  const error = exc as { name?: string; code?: string; message?: string } | null;
  const name = error?.name ?? "";
  const message = error?.message ?? String(exc);
  if (name === "ClusterAllFailedError") {
    const last = (exc as { lastNodeError?: unknown }).lastNodeError;
    return `no node of the Redis Cluster answers${last ? `: ${describeRaw(last, client)}` : ""}`;
  }
  if (name === "MaxRetriesPerRequestError" || message === CONNECTION_CLOSED || message.startsWith(NOT_WRITEABLE)) {
    // The command was queued for a connection that failed: the connection's failure is the cause.
    const cause = client === null ? undefined : lastFailure.get(client);
    return cause ?? "the connection to Redis closed";
  }
  if (error?.code !== undefined && CAUSES[error.code] !== undefined && client !== null) {
    return cannotConnect(exc, hostOf(client), portOf(client));
  }
  return name && name !== "Error" && !message.startsWith(name) ? `${name}: ${message}` : message;
}

/** Why a connection to host:port could not be opened, in the Python SDK's words. */
export function cannotConnect(exc: unknown, host: string, port: number | string): string {
  const error = exc as { code?: string; message?: string; address?: string; port?: number } | null;
  const known = error?.code === undefined ? undefined : CAUSES[error.code];
  // A socket's error names the address it tried (a cluster's node, say): the most exact.
  const where = error?.address !== undefined && error.port !== undefined ? `${error.address}:${error.port}` : `${host}:${port}`;
  return `cannot connect to ${where}: ${known ?? error?.message ?? String(exc)}`;
}

const CAUSES: Record<string, string> = {
  ECONNREFUSED: "connection refused (nothing listens there)",
  ENOTFOUND: "the name does not resolve",
  EAI_AGAIN: "the name does not resolve (temporary failure)",
  ETIMEDOUT: "timed out",
  ECONNRESET: "connection reset",
  EHOSTUNREACH: "no route to host",
  ENETUNREACH: "network unreachable",
  EPIPE: "connection closed",
};

function hostOf(client: Redis | Cluster): string {
  if (isCluster(client)) return "the Redis Cluster";
  return client.options.host ?? "127.0.0.1";
}

function portOf(client: Redis | Cluster): number | string {
  if (isCluster(client)) return "";
  return client.options.path ?? client.options.port ?? 6379;
}

/** Throws at once when `client` is reconnecting after a failed attempt (see unreachable()). */
export function reachable(client: Redis | Cluster): void {
  const reason = unreachable(client);
  if (reason !== null) throw new RedisUnreachable(reason);
}

/** What a caller gets when Redis fails a call made for it (`what`: what was being done, as in
 * "running track"): RedisUnavailable, naming the cause in an operator's words (as
 * outpost_async/_context.py's redis_unavailable). A bug of ours is thrown as it is. */
export function redisUnavailable(what: string, exc: unknown, client: Redis | Cluster | null): RedisUnavailable {
  if (!failedInRedis(exc)) throw exc;
  if (exc instanceof RedisUnavailable) return exc;
  return new RedisUnavailable(`Redis failed ${what}: ${describe(exc, client)}`);
}
