/** failedInRedis against the errors real ioredis gives: from a real redis-server (a bad command, a
 * closed port, a dropped connection, a timeout), a real Redis Cluster (MOVED, CLUSTERDOWN, no node
 * answering) and a real TLS port (a refused certificate); each is Redis failing. Our own
 * exceptions (a TypeError, a RangeError, a failed invariant of the core) are bugs. */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { createServer } from "node:net";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { after, before, describe, it } from "node:test";
import { Cluster, Redis, type RedisOptions, ReplyError } from "ioredis";
import { DeliveryRecovery } from "../../src/core/deliveryRecovery.js";
import { InvalidEvent, RedisUnavailable, UsageError } from "../../src/core/errors.js";
import { slotOf } from "../../src/driver/cluster.js";
import { reachable, redisUnavailable, watched } from "../../src/driver/connections.js";
import { RedisUnreachable, failedInRedis } from "../../src/driver/redisFailure.js";
import { RedisCluster } from "../support/redisCluster.js";
import { RedisServer, freePort, waitFor } from "../support/redisServer.js";

const run = promisify(execFile);
/** A client that gives up at once: no reconnection, no retry of a command. */
const AT_ONCE: RedisOptions = { maxRetriesPerRequest: 0, retryStrategy: () => null };

/** The error `call` rejects with; one that resolves fails the test. */
async function rejection(call: Promise<unknown>): Promise<unknown> {
  try {
    await call;
  } catch (exc) {
    return exc;
  }
  assert.fail("resolved, expected a rejection");
}

/** What `client` emits as "error" events, from now on. */
function emitted(client: Redis | Cluster): unknown[] {
  const seen: unknown[] = [];
  client.on("error", (exc: unknown) => seen.push(exc));
  return seen;
}

/** `redis`'s command's rejection and the first error its connection emitted, each checked to be
 * Redis failing. */
async function failedCommand(redis: Redis): Promise<[unknown, NodeJS.ErrnoException]> {
  const errors = emitted(redis);
  const command = await rejection(redis.get("key"));
  assert.equal(failedInRedis(command), true);
  const first = errors[0] as NodeJS.ErrnoException;
  assert.equal(failedInRedis(first), true);
  return [command, first];
}

/** The exception `bug` throws. */
function thrownBy(bug: () => unknown): unknown {
  try {
    bug();
  } catch (exc) {
    return exc;
  }
  assert.fail("did not throw");
}

/** A redis-server cluster-enabled but serving no slot: every key command answers CLUSTERDOWN. */
class SlotlessClusterNode extends RedisServer {
  protected override extraArgs(): string[] {
    return ["--cluster-enabled", "yes", "--cluster-config-file", `nodes-${this.port}.conf`];
  }
}

/** A redis-server with a TLS port too, its certificate self-signed for "localhost". */
class TlsRedisServer extends RedisServer {
  tlsPort = 0;
  readonly files: string;

  constructor(files: string) {
    super();
    this.files = files;
  }

  static async withTls(files: string): Promise<TlsRedisServer> {
    const certificate = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"];
    await run("openssl", [...certificate, "-keyout", join(files, "key.pem"), "-out", join(files, "cert.pem")]);
    const server = new TlsRedisServer(files);
    server.tlsPort = await freePort();
    await server.start();
    return server;
  }

  protected override extraArgs(): string[] {
    const files = this.files;
    return ["--tls-port", String(this.tlsPort), "--tls-cert-file", join(files, "cert.pem"), "--tls-key-file", join(files, "key.pem"), "--tls-auth-clients", "no"];
  }
}

describe("failedInRedis: what real ioredis gives when Redis fails", () => {
  let server: RedisServer;
  const clients: (Redis | Cluster)[] = [];
  /** A client of the test's, disconnected after the tests. */
  const client = <C extends Redis | Cluster>(made: C): C => {
    clients.push(made);
    return made;
  };

  before(async () => {
    server = await RedisServer.start();
  });
  after(async () => {
    for (const made of clients) made.disconnect();
    await server.stop();
  });

  it("a reply error: an unknown command, a stream without its group", async () => {
    const redis = client(new Redis({ port: server.port, ...AT_ONCE }));
    const unknown = await rejection(redis.call("NO-SUCH-COMMAND"));
    assert.match(String(unknown), /^ReplyError: ERR unknown command/);
    assert.equal(failedInRedis(unknown), true);
    const noGroup = await rejection(redis.xreadgroup("GROUP", "no-group", "consumer", "STREAMS", "no-stream", ">"));
    assert.match(String(noGroup), /NOGROUP/);
    assert.equal(failedInRedis(noGroup), true);
  });

  it("a refused connection: the socket's ECONNREFUSED, and the command given up with it", async () => {
    const port = await freePort(); // nothing listens there
    const [closed, refused] = await failedCommand(client(new Redis({ port, ...AT_ONCE })));
    assert.equal((closed as Error).message, "Connection is closed.");
    assert.deepEqual([refused.code, refused.syscall], ["ECONNREFUSED", "connect"]);
    // A client that reconnects gives the command up after its retries instead.
    const reconnecting = client(new Redis({ port, maxRetriesPerRequest: 0 }));
    emitted(reconnecting);
    const gaveUp = await rejection(reconnecting.get("key"));
    assert.equal((gaveUp as Error).name, "MaxRetriesPerRequestError");
    assert.equal(failedInRedis(gaveUp), true);
  });

  it("a Unix socket that is not there (ENOENT on connect)", async () => {
    const missing = client(new Redis({ path: join(tmpdir(), "outpost-no-such-directory", "redis.sock"), ...AT_ONCE }));
    const [, noSocket] = await failedCommand(missing);
    assert.deepEqual([noSocket.code, noSocket.syscall], ["ENOENT", "connect"]);
  });

  it("a connection closed by disconnect(), and one killed under a blocking command", async () => {
    const redis = client(new Redis({ port: server.port, ...AT_ONCE }));
    await redis.ping();
    redis.disconnect();
    const closed = await rejection(redis.get("key"));
    assert.equal((closed as Error).message, "Connection is closed.");
    assert.equal(failedInRedis(closed), true);
    const doomed = await RedisServer.start();
    try {
      const blocked = client(new Redis({ port: doomed.port, ...AT_ONCE }));
      emitted(blocked);
      await blocked.ping();
      const waiting = rejection(blocked.blpop("no-list", 30));
      doomed.kill();
      assert.equal(failedInRedis(await waiting), true);
    } finally {
      await doomed.stop();
    }
  });

  it("a command sent while the connection is down and nothing queues it", async () => {
    const offline = client(new Redis({ port: server.port, enableOfflineQueue: false, lazyConnect: true }));
    const refused = await rejection(offline.get("key"));
    assert.match((refused as Error).message, /^Stream isn't writeable/);
    assert.equal(failedInRedis(refused), true);
  });

  it("a command Redis did not answer in time (commandTimeout)", async () => {
    const slow = client(new Redis({ port: server.port, commandTimeout: 50, ...AT_ONCE }));
    const late = await rejection(slow.blpop("no-list", 5));
    assert.equal((late as Error).message, "Command timed out");
    assert.equal(failedInRedis(late), true);
  });

  it("a connection attempt that got no answer (ETIMEDOUT: TLS to a plain port)", async () => {
    const silent = client(new Redis({ port: server.port, tls: {}, connectTimeout: 100, ...AT_ONCE }));
    const [, timedOut] = await failedCommand(silent);
    assert.deepEqual([timedOut.code, timedOut.message], ["ETIMEDOUT", "connect ETIMEDOUT"]);
  });

  it("the driver's own words: a connection reconnecting (RedisUnreachable), RedisUnavailable", async () => {
    const port = await freePort();
    const down = client(watched(new Redis({ port, maxRetriesPerRequest: 0, retryStrategy: () => 1000 })));
    const errors = emitted(down);
    await waitFor("a failed attempt", () => (errors.length ? true : undefined));
    const unreachable = thrownBy(() => reachable(down));
    assert.ok(unreachable instanceof RedisUnreachable);
    assert.equal(failedInRedis(unreachable), true);
    const unavailable = redisUnavailable("running track", unreachable, down);
    assert.ok(unavailable instanceof RedisUnavailable);
    assert.match(unavailable.message, /^Redis failed running track: cannot connect to 127\.0\.0\.1:\d+: connection refused/);
    assert.equal(failedInRedis(unavailable), true);
    // A bug is no RedisUnavailable: it is thrown as it is.
    const bug = new TypeError("a bug of ours");
    assert.equal(thrownBy(() => redisUnavailable("running track", bug, down)), bug);
  });

  it("an error of another copy of ioredis's error classes (an application's own client)", () => {
    const require = createRequire(import.meta.url);
    const home = join(require.resolve("redis-errors"), "..");
    const ours = Object.keys(require.cache).filter((path) => path.startsWith(home));
    const saved = ours.map((path) => [path, require.cache[path]] as const);
    for (const path of ours) delete require.cache[path];
    let copy: { ReplyError: new (message: string) => Error };
    try {
      copy = require("redis-errors") as typeof copy;
    } finally {
      for (const [path, module] of saved) require.cache[path] = module;
    }
    const theirs = new copy.ReplyError("ERR from another copy");
    assert.ok(!(theirs instanceof (ReplyError as new () => Error))); // another copy indeed
    assert.equal(failedInRedis(theirs), true);
  });
});

describe("failedInRedis: a Redis Cluster failing", () => {
  it("CLUSTERDOWN from a node that serves no slot", async () => {
    const node = new SlotlessClusterNode();
    await node.start();
    const redis = new Redis({ port: node.port, ...AT_ONCE });
    try {
      const down = await rejection(redis.get("key"));
      assert.match(String(down), /CLUSTERDOWN/);
      assert.equal(failedInRedis(down), true);
    } finally {
      redis.disconnect();
      await node.stop();
    }
  });

  it("MOVED from a node asked for a key another one serves", async () => {
    const cluster = await RedisCluster.start(3, 0);
    const [[, , owner]] = (await cluster.slotOwners()).filter(([first, last]) => first <= slotOf("key") && slotOf("key") <= last) as [[number, number, number]];
    const other = cluster.livePorts().find((port) => port !== owner) as number;
    const redis = new Redis({ port: other, ...AT_ONCE });
    try {
      const moved = await rejection(redis.get("key"));
      assert.match(String(moved), new RegExp(`^ReplyError: MOVED ${slotOf("key")} 127\\.0\\.0\\.1:${owner}`));
      assert.equal(failedInRedis(moved), true);
    } finally {
      redis.disconnect();
      await cluster.stop();
    }
  });

  it("a cluster none of whose nodes answers: the command, the slot map's refresh (ClusterAllFailedError)", async () => {
    const cluster = new Cluster([{ host: "127.0.0.1", port: await freePort() }], { clusterRetryStrategy: () => null });
    const errors = emitted(cluster);
    try {
      const none = await rejection(cluster.get("key"));
      assert.equal((none as Error).message, "None of startup nodes is available");
      assert.equal(failedInRedis(none), true);
      const allFailed = errors.find((exc) => (exc as Error).name === "ClusterAllFailedError");
      assert.ok(allFailed !== undefined, String(errors));
      assert.equal(failedInRedis(allFailed), true);
      const refresh = await new Promise<unknown>((resolve) => cluster.refreshSlotsCache((exc) => resolve(exc)));
      assert.equal((refresh as Error).name, "ClusterAllFailedError");
      assert.equal(failedInRedis(refresh), true);
    } finally {
      cluster.disconnect();
    }
  });
});

describe("failedInRedis: TLS failing", () => {
  let server: TlsRedisServer;
  let files: string;

  before(async () => {
    files = mkdtempSync(join(tmpdir(), "outpost-ts-tls-"));
    server = await TlsRedisServer.withTls(files);
  });
  after(async () => {
    await server.stop();
    rmSync(files, { recursive: true, force: true });
  });

  /** The first error a TLS client emitted (the command and it checked to be Redis failing). */
  async function failedHandshake(options: RedisOptions): Promise<NodeJS.ErrnoException> {
    const redis = new Redis({ port: server.tlsPort, ...AT_ONCE, ...options });
    try {
      return (await failedCommand(redis))[1];
    } finally {
      redis.disconnect();
    }
  }

  it("a certificate the client does not trust (self-signed)", async () => {
    const refused = await failedHandshake({ tls: {} });
    assert.equal(refused.code, "DEPTH_ZERO_SELF_SIGNED_CERT");
  });

  it("a certificate for another name", async () => {
    const ca = await readFile(join(files, "cert.pem"));
    const refused = await failedHandshake({ tls: { ca, servername: "redis.example" } });
    assert.equal(refused.code, "ERR_TLS_CERT_ALTNAME_INVALID");
  });

  it("a peer that answers without TLS", async () => {
    const plain = createServer((socket) => socket.end("-ERR this port speaks no TLS\r\n"));
    await new Promise<void>((resolve) => plain.listen(0, "127.0.0.1", resolve));
    const port = (plain.address() as { port: number }).port;
    const redis = new Redis({ port, tls: {}, ...AT_ONCE });
    try {
      const [, wrong] = await failedCommand(redis);
      assert.match(String(wrong.code), /^ERR_SSL_/);
    } finally {
      redis.disconnect();
      plain.close();
    }
  });

  it("a plain client on the TLS port: the connection reset", async () => {
    const redis = new Redis({ port: server.tlsPort, ...AT_ONCE });
    const errors = emitted(redis);
    try {
      assert.equal(failedInRedis(await rejection(redis.get("key"))), true);
      assert.ok(errors.length > 0 && errors.every(failedInRedis), String(errors));
    } finally {
      redis.disconnect();
    }
  });
});

describe("failedInRedis: bugs of ours", () => {
  it("a TypeError, a RangeError, a plain Error", () => {
    const typeError = thrownBy(() => (undefined as unknown as { field: number }).field);
    assert.ok(typeError instanceof TypeError);
    assert.equal(failedInRedis(typeError), false);
    const rangeError = thrownBy(() => new Array(-1));
    assert.ok(rangeError instanceof RangeError);
    assert.equal(failedInRedis(rangeError), false);
    assert.equal(failedInRedis(new Error("a bug of ours")), false);
    // ioredis's words in an error of another class: not ioredis's
    assert.equal(failedInRedis(new SyntaxError("Connection is closed.")), false);
  });

  it("the core's failed invariant, a misuse, our own errors that are no Redis failure", () => {
    const invariant = thrownBy(() => new DeliveryRecovery().readEnded());
    assert.ok(invariant instanceof UsageError);
    assert.equal(failedInRedis(invariant), false);
    assert.equal(failedInRedis(new InvalidEvent("no such meter")), false);
  });

  it("what is no error at all: a string, undefined", () => {
    assert.equal(failedInRedis("Connection is closed."), false);
    assert.equal(failedInRedis(undefined), false);
    assert.equal(failedInRedis(null), false);
  });

  it("a system error that is no socket's (a file not found), and ioredis refusing a misuse", async () => {
    const missing = await rejection(readFile("/no/such/file"));
    assert.equal((missing as NodeJS.ErrnoException).code, "ENOENT");
    assert.equal(failedInRedis(missing), false);
    const server = await RedisServer.start();
    const redis = new Redis({ port: server.port, ...AT_ONCE });
    try {
      await redis.ping();
      const misuse = await rejection(redis.connect()); // a plain Error ioredis made, for a misuse
      assert.equal((misuse as Error).message, "Redis is already connecting/connected");
      assert.equal(failedInRedis(misuse), false);
    } finally {
      redis.disconnect();
      await server.stop();
    }
  });
});
