/** An option the constructor refuses leaves nothing open: no Redis client reconnecting forever
 * behind the error, which would keep the application's process alive. Each refusal runs in a
 * child process that must exit on its own once the script is done. */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { describe, it } from "node:test";
import { pathToFileURL } from "node:url";
import { promisify } from "node:util";
import { Outpost } from "../../src/driver/outpost.js";
import { ConfigurationError, UsageError } from "../../src/core/errors.js";
import { REPO } from "../support/paths.js";

const run = promisify(execFile);
const INDEX = pathToFileURL(join(REPO, "ts", "src", "index.ts")).href;
/** Long enough for a loaded machine to start Node and tsx; a leaked client never lets it end. */
const DEADLINE_MS = 60_000;

/** Options of each place that checks them after the client is made: the session's settings, delivery's, the link's URL. */
const REFUSED: Record<string, unknown>[] = [
  { snapshotTimeout: -1 },
  { maxCustomers: 0 },
  { idleCustomerTtl: 0 },
  { batchSize: 0 },
  { heartbeat: 0 },
  { batchBytes: 100 },
  { linger: -1 },
  { serverUrl: "ftp://polar.example", accessToken: "polar_oat_x" },
];

describe("options refused at construction", () => {
  it("leave no connection open: the process exits by itself after each refusal", async () => {
    const script = `
      import { Outpost } from ${JSON.stringify(INDEX)};
      for (const refused of ${JSON.stringify(REFUSED)}) {
        try {
          new Outpost({ redisUrl: "redis://127.0.0.1:1/0", telemetry: false, ...refused });
          console.log("constructed", JSON.stringify(refused));
        } catch (exc) {
          console.log(exc.name);
        }
      }`;
    const child = run(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { cwd: join(REPO, "ts"), timeout: DEADLINE_MS, killSignal: "SIGKILL" });
    const { stdout } = await child.catch((exc: { killed?: boolean; stdout?: string }) => {
      assert.fail(`the process did not exit by itself (killed: ${String(exc.killed)}); it printed ${JSON.stringify(exc.stdout)}`);
    });
    assert.deepEqual(stdout.trim().split("\n"), REFUSED.map(() => "UsageError"));
  });
});

describe("the messages of refused options", () => {
  it("name the option as the Python SDK does, in the same words", () => {
    const options = { redisUrl: "redis://127.0.0.1:1/0", telemetry: false };
    const python = "public_margin must be >= 0 and poll_interval > 0";
    for (const refused of [{ publicMargin: -1 }, { pollInterval: 0 }]) {
      assert.throws(() => new Outpost({ ...options, ...refused }), (exc: unknown) => exc instanceof ConfigurationError && exc.message === python);
    }
  });
});

describe("numbers no loop could use", () => {
  it("are refused at construction with the option's name, as in Python: NaN, an infinity, a fraction where a count is meant, a telemetry interval of 0", () => {
    const options = { redisUrl: "redis://127.0.0.1:1/0", telemetry: false, accessToken: "polar_oat_x" };
    const refused: [Record<string, unknown>, string][] = [
      [{ batchSize: NaN }, "batch_size must be an integer, at least 1, got nan"],
      [{ maxInFlight: 1.5 }, "max_in_flight must be an integer, at least 1, got 1.5"],
      [{ maxInFlight: NaN }, "max_in_flight must be an integer, at least 1, got nan"],
      [{ linger: NaN }, "linger must be a finite number, not negative, got nan"],
      [{ heartbeat: Infinity }, "heartbeat must be a positive, finite number, got inf"],
      [{ requestsPerMinute: NaN }, "requests_per_minute must be a finite number, not negative (0: no budget), got nan"],
      [{ telemetryInterval: 0 }, "telemetry_interval must be a positive, finite number, got 0"],
      [{ telemetryInterval: NaN }, "telemetry_interval must be a positive, finite number, got nan"],
    ];
    for (const [bad, message] of refused) {
      assert.throws(() => new Outpost({ ...options, ...bad }), (exc: unknown) => exc instanceof UsageError && exc.message === message, message);
    }
  });
});

describe("empty settings", () => {
  it("count as unset, as in Python: an empty POLAR_SERVER_URL is Polar's API, not a URL to refuse", async () => {
    const saved = process.env.POLAR_SERVER_URL;
    process.env.POLAR_SERVER_URL = "";
    try {
      for (const serverUrl of [undefined, ""]) {
        const outpost = new Outpost({ redisUrl: "redis://127.0.0.1:1/0", accessToken: "polar_oat_x", telemetry: false, ...(serverUrl === undefined ? {} : { serverUrl }) });
        await outpost.close(0.1);
      }
    } finally {
      if (saved === undefined) delete process.env.POLAR_SERVER_URL;
      else process.env.POLAR_SERVER_URL = saved;
    }
  });
});
