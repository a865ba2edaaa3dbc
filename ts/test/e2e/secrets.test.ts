/** Hostile input and secrets, as the Python SDK: no secret (an access token, a Redis password)
 * reaches a log line at any level, an error or a getter; a token sent over plain http:// to
 * another machine is warned about once; a Redis URL of an unknown scheme is a ConfigurationError;
 * an ingestion answer is read up to 1 MiB whatever its size. And the messages that say what
 * happened: close() does not wait on a flush a refused token stalls, a refused token over a
 * configuration cached in Redis is named in NotReady, Polar unreachable mid-run is one warning. */

import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import { describe, it } from "node:test";
import { CONFIGURATION_KEY } from "../../src/core/index.js";
import { ConfigurationError, NotReady, Outpost, OutpostError } from "../../src/index.js";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { eventually } from "../support/eventually.js";
import { rejection } from "../support/failing.js";
import { Lines } from "../support/lines.js";
import { listenOnLoopback } from "../support/loopback.js";
import { RedisServer, freePort } from "../support/redisServer.js";
import { sharedEmulator } from "../support/sharedEmulator.js";
import { testOptions } from "../support/testOptions.js";

const REDIS_PASSWORD = "redis-pw-7f3a";
const CONFIGURATION = {
  reducers: [{ id: "r-count", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "count" }, meter_ids: ["m-count"] }],
};

function assertNoSecret(text: string, secrets: string[]): void {
  for (const secret of secrets) {
    const at = text.indexOf(secret);
    assert.ok(at < 0, `a secret in: ${text.slice(Math.max(0, at - 200), at + 200)}`);
  }
}

/** An ingestion endpoint that answers 500 with a body of `size` bytes, and counts what each
 * ingestion answer got to send before its connection closed (the WebSocket's upgrade gets the
 * same answer, not counted: the link keeps only the refusal's first bytes). */
class FloodingServer {
  readonly sent: number[] = [];
  private readonly server: Server;

  constructor(size: number) {
    this.server = createServer((request, response) => {
      request.resume();
      request.on("end", () => {
        response.writeHead(500, { "content-type": "text/plain", "content-length": String(size) });
        const chunk = Buffer.alloc(64 * 1024, 0x78);
        let written = 0;
        let flushed = 0;
        if (request.url === "/v1/events/ingest") response.on("close", () => this.sent.push(flushed));
        const pump = (): void => {
          while (written < size && !response.destroyed) {
            written += chunk.length;
            const ok = response.write(chunk, () => (flushed += chunk.length));
            if (!ok) return void response.once("drain", pump);
          }
          if (written >= size) response.end();
        };
        pump();
      });
    });
  }

  listen(): Promise<string> {
    return listenOnLoopback(this.server);
  }

  close(): void {
    this.server.closeAllConnections();
    this.server.close();
  }
}

describe("hostile input and secrets", () => {
  const shared = sharedEmulator();

  it("no output of a session holds a secret (a Redis password, a token, a refused token)", async () => {
    const redis = await RedisServer.start();
    const wrongToken = "polar_oat_wrong-secret-5e1d";
    try {
      await redis.client().config("SET", "requirepass", REDIS_PASSWORD);
      const locked = `redis://:${REDIS_PASSWORD}@127.0.0.1:${redis.port}/0`;
      const lines = new Lines();
      const outputs: string[] = [];
      const show = (value: unknown) => outputs.push(String(value), JSON.stringify(value) ?? "", (value as Error)?.stack ?? "");
      const good = new Outpost(testOptions(shared.emulator, redis, { redisUrl: locked, logger: lines.logger }));
      await good.balance(shared.calls, { externalCustomerId: "c1" });
      await good.track("api_call", { externalCustomerId: "c1" });
      assert.ok(await good.flush(5));
      show([good.deliveryStalled, good.rejections, good.connected, good.subscribed]);
      await good.close(2);
      const wrong = new Outpost(testOptions(shared.emulator, redis, { redisUrl: locked, accessToken: wrongToken, logger: lines.logger, snapshotTimeout: 0.5 }));
      const refused = await rejection(wrong.balance(shared.calls, { externalCustomerId: "c2" }));
      assert.ok(refused instanceof NotReady, String(refused));
      show(refused);
      await wrong.track("api_call", { externalCustomerId: "c1" });
      await eventually(() => wrong.deliveryStalled !== null, "a stall");
      show([wrong.deliveryStalled, wrong.rejections]);
      await wrong.close(1);
      const down = `redis://:${REDIS_PASSWORD}@127.0.0.1:${await freePort()}/0`;
      const unreachable = new Outpost(testOptions(shared.emulator, redis, { redisUrl: down, logger: lines.logger, snapshotTimeout: 0.5 }));
      show(await rejection(unreachable.track("api_call", { externalCustomerId: "c1" })));
      show(await rejection(unreachable.balance(shared.calls, { externalCustomerId: "c1" })));
      await unreachable.close(1);
      const badPassword = new Outpost(testOptions(shared.emulator, redis, { redisUrl: `redis://:not-${REDIS_PASSWORD}@127.0.0.1:${redis.port}/0`, logger: lines.logger }));
      show(await rejection(badPassword.track("api_call", { externalCustomerId: "c1" })));
      await badPassword.close(1);
      outputs.push(lines.text);
      assert.ok(lines.at("debug").length > 0 && lines.at("warn").length > 0, lines.text); // what was searched
      assertNoSecret(outputs.join("\n"), [shared.emulator.token, wrongToken, REDIS_PASSWORD]);
    } finally {
      await redis.stop();
    }
  });

  it("warns once about a token over plain http:// to another host (server and telemetry URLs), without the token", async () => {
    const lines = new Lines();
    const outpost = new Outpost({
      accessToken: "polar_oat_secret",
      serverUrl: "http://polar.internal:8000",
      telemetryUrl: "http://relay.internal:9000",
      redisUrl: `redis://:${REDIS_PASSWORD}@127.0.0.1:${await freePort()}/0`,
      logger: lines.logger,
    });
    await outpost.close(0.5);
    const warnings = lines.at("warn").filter((l) => l.includes("plain http://"));
    assert.equal(warnings.length, 2, lines.text);
    assert.match(warnings[0] as string, /server URL http:\/\/polar\.internal:8000/);
    assert.match(warnings[1] as string, /telemetry URL http:\/\/relay\.internal:9000/);
    assertNoSecret(lines.text, ["polar_oat_secret", REDIS_PASSWORD]);
    const local = new Lines();
    await new Outpost({ accessToken: "t", serverUrl: "http://localhost:8000", redisUrl: `redis://127.0.0.1:${await freePort()}/0`, telemetry: false, logger: local.logger }).close(0.5);
    assert.deepEqual(local.at("warn").filter((l) => l.includes("plain http://")), []);
  });

  it("a Redis URL of an unknown scheme is a ConfigurationError, without the URL", () => {
    const secret = `http://:${REDIS_PASSWORD}@127.0.0.1:6379/0`;
    assert.throws(
      () => new Outpost({ redisUrl: secret, telemetry: false }),
      (exc: Error) => exc instanceof ConfigurationError && exc instanceof OutpostError && /redis_url: .*redis:\/\//.test(exc.message) && !exc.message.includes(REDIS_PASSWORD),
    );
  });

  it("reads an ingestion answer's body up to 1 MiB, whatever its size", async () => {
    const redis = await RedisServer.start();
    const server = new FloodingServer(64 << 20);
    try {
      await redis.client().set(CONFIGURATION_KEY, JSON.stringify(CONFIGURATION));
      const outpost = new Outpost(testOptions(shared.emulator, redis, { serverUrl: await server.listen(), linger: 0.01, retryBase: 0.05 }));
      await outpost.track("api_call", { externalCustomerId: "c1" });
      await eventually(() => server.sent.length >= 1, "an ingestion answer", 30);
      await outpost.close(0.5);
      // The kernel's socket buffers take a few MiB whatever the client reads; never all 64.
      assert.ok(Math.max(...server.sent) < 16 << 20, JSON.stringify(server.sent));
    } finally {
      server.close();
      await redis.stop();
    }
  });

  it("close() does not wait on a flush that a refused token stalls, and says so once", async () => {
    const redis = await RedisServer.start();
    try {
      const good = new Outpost(testOptions(shared.emulator, redis)); // leaves Polar's configuration in Redis
      await good.balance(shared.calls, { externalCustomerId: "c1" });
      await good.close(2);
      const lines = new Lines();
      const wrong = new Outpost(testOptions(shared.emulator, redis, { accessToken: "polar_oat_wrong", logger: lines.logger }));
      await wrong.track("api_call", { externalCustomerId: "c1" });
      await eventually(() => wrong.deliveryStalled !== null, "a stall");
      await wrong.close(10);
      const said = lines.at("warn").filter((l) => l.includes("closes without flushing"));
      assert.equal(said.length, 1, lines.text);
      assert.match(said[0] as string, /401/);
    } finally {
      await redis.stop();
    }
  });

  it("a refused token over a configuration cached in Redis is named in NotReady, not UnknownMeter", async () => {
    const redis = await RedisServer.start();
    try {
      const good = new Outpost(testOptions(shared.emulator, redis));
      await good.balance(shared.calls, { externalCustomerId: "c1" });
      await good.close(2);
      const newer = await shared.emulator.createMeter("newer", CALLS_FILTER, { func: "count" }); // not in Redis's copy
      const wrong = new Outpost(testOptions(shared.emulator, redis, { accessToken: "polar_oat_wrong", snapshotTimeout: 1 }));
      try {
        await rejection(wrong.balance(newer, { externalCustomerId: "c1" })); // starts it
        await eventually(async () => /HTTP 401/.test((await rejection(wrong.balance(newer, { externalCustomerId: "c1" }))).message), "the refusal");
        const read = await rejection(wrong.balance(newer, { externalCustomerId: "c1" }));
        assert.ok(read instanceof NotReady, String(read));
        assert.match(read.message, /not in the configuration cached in Redis.*HTTP 401/);
      } finally {
        await wrong.close(1);
      }
    } finally {
      await redis.stop();
    }
  });

  it("Polar unreachable mid-run is one warning naming the WebSocket", async () => {
    const [redis, polar] = await Promise.all([RedisServer.start(), Emulator.start()]);
    const lines = new Lines();
    try {
      const meter = await polar.createMeter("calls", CALLS_FILTER, { func: "count" });
      const outpost = new Outpost(testOptions(polar, redis, { logger: lines.logger }));
      await outpost.balance(meter, { externalCustomerId: "c1" });
      await polar.stop(); // Polar goes away; the instance tries to reconnect, and fails
      const unreachable = () => lines.at("warn").filter((l) => l.includes("Polar unreachable"));
      await eventually(() => unreachable().length > 0, "a warning");
      await eventually(() => !outpost.connected, "the link down");
      await outpost.close(1);
      assert.equal(unreachable().length, 1, lines.text);
      assert.match(unreachable()[0] as string, /the WebSocket/);
    } finally {
      await Promise.all([redis.stop(), polar.stop()]);
    }
  });
});
