/** The Python emulator of Polar (`outpost emulator`), started by the tests on a free loopback
 * port, and its admin API (docs/emulator.md). */

import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { signalAndWait } from "./childProcess.js";
import { REPO } from "./paths.js";
import { freePort, waitFor } from "./redisServer.js";

export const PYTHON = join(REPO, ".venv", "bin", "python");
const OUTPOST = join(REPO, ".venv", "bin", "outpost");

export class Emulator {
  /** A token of this emulator's own: what answers with it is this process, not another one that
   * took the port between the look for a free one and this one's bind. */
  readonly token = `polar_oat_ts_tests_${randomBytes(6).toString("hex")}`;
  port = 0;
  private process: ChildProcess | null = null;
  private log = "";

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** publicOnly: Polar's public API as it is (no /v1/outpost/; docs/emulator.md), its customer
   * meters recomputed recomputeDelays[0] seconds after a customer's last ingest. */
  static async start(options: { publicOnly?: boolean; recomputeDelays?: [number, number] } = {}): Promise<Emulator> {
    if (!existsSync(OUTPOST)) throw new Error(`${OUTPOST} is missing: run ./dev once (it creates .venv)`);
    // The port may be taken between the look for a free one and the bind: then try another.
    for (let attempt = 1; ; attempt++) {
      try {
        return await Emulator.startOnce(options);
      } catch (exc) {
        if (attempt >= 3 || !(exc instanceof PortTaken)) throw exc;
      }
    }
  }

  private static async startOnce(options: { publicOnly?: boolean; recomputeDelays?: [number, number] }): Promise<Emulator> {
    const emulator = new Emulator();
    emulator.port = await freePort();
    const args = ["emulator", "--host", "127.0.0.1", "--port", String(emulator.port), "--token", emulator.token, "--log-level", "warning"];
    if (options.publicOnly) args.push("--public-only");
    if (options.recomputeDelays) args.push("--recompute-delays", ...options.recomputeDelays.map(String));
    const child = spawn(OUTPOST, args, { stdio: ["ignore", "ignore", "pipe"] });
    emulator.process = child;
    child.stderr?.on("data", (chunk: Buffer) => {
      emulator.log = (emulator.log + chunk.toString()).slice(-4000);
    });
    await waitFor(
      "the emulator to answer",
      async () => {
        if (child.exitCode !== null) {
          if (emulator.log.includes("address already in use")) throw new PortTaken(emulator.log);
          throw new Error(`the emulator exited: ${emulator.log}`);
        }
        let answer: Response;
        try {
          answer = await fetch(`${emulator.url}/v1/meters/`, { headers: { authorization: `Bearer ${emulator.token}` } });
        } catch {
          return undefined;
        }
        // Another server on the port would not know this token.
        if (answer.status === 401 || answer.status === 404) {
          await emulator.stop();
          throw new PortTaken(`another server answers on port ${emulator.port}`);
        }
        return answer.ok ? true : undefined;
      },
      30,
    );
    return emulator;
  }

  async stop(): Promise<void> {
    const child = this.process;
    this.process = null;
    // It lets the requests in flight finish first: one a test made hang would hold it for
    // the hang's full length (a minute).
    const kill = setTimeout(() => child?.kill("SIGKILL"), 2000);
    await signalAndWait(child, "SIGTERM");
    clearTimeout(kill);
  }

  async admin(name: string, body?: unknown): Promise<any> {
    const response = await fetch(`${this.url}/__emulator/${name}`, {
      method: body === undefined ? "GET" : "POST",
      body: body === undefined ? undefined : JSON.stringify(body),
      headers: { "content-type": "application/json" },
    });
    const answer: unknown = await response.json();
    if (!response.ok) throw new Error(`admin ${name} answered ${response.status}: ${JSON.stringify(answer)}`);
    return answer;
  }

  /** A meter (as POST /v1/meters/); returns its id. */
  async createMeter(name: string, filter: unknown, aggregation: unknown): Promise<string> {
    const response = await fetch(`${this.url}/v1/meters/`, {
      method: "POST",
      body: JSON.stringify({ name, filter, aggregation }),
      headers: { "content-type": "application/json", authorization: `Bearer ${this.token}` },
    });
    const meter = (await response.json()) as { id: string };
    if (!response.ok) throw new Error(`creating a meter answered ${response.status}: ${JSON.stringify(meter)}`);
    return meter.id;
  }

  async customerMeter(meterId: string, externalCustomerId: string): Promise<any> {
    return this.admin("customer-meter", { meter_id: meterId, external_customer_id: externalCustomerId });
  }
}

class PortTaken extends Error {}

export const CALLS_FILTER = { conjunction: "and", clauses: [{ property: "name", operator: "eq", value: "api_call" }] };
