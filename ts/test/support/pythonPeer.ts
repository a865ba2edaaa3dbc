/** Drive test/support/python_peer.py: a Python Outpost instance in its own process. */

import { type ChildProcess, spawn } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { PYTHON } from "./emulator.js";
import { REPO } from "./paths.js";

export class PythonPeer {
  private readonly answers: ((line: string) => void)[] = [];
  private stderr = "";

  private constructor(private readonly child: ChildProcess) {
    createInterface({ input: child.stdout! }).on("line", (line) => this.answers.shift()?.(line));
    child.stderr?.on("data", (chunk: Buffer) => {
      this.stderr = (this.stderr + chunk.toString()).slice(-4000);
    });
  }

  static async start(options: Record<string, unknown>): Promise<PythonPeer> {
    const script = join(REPO, "ts", "test", "support", "python_peer.py");
    const child = spawn(PYTHON, [script, JSON.stringify(options)], { cwd: REPO, stdio: ["pipe", "pipe", "pipe"] });
    const peer = new PythonPeer(child);
    await peer.next();
    return peer;
  }

  private next(): Promise<any> {
    return new Promise((resolve, reject) => {
      const onExit = () => reject(new Error(`the Python peer exited: ${this.stderr}`));
      this.child.once("exit", onExit);
      this.answers.push((line) => {
        this.child.off("exit", onExit);
        resolve(JSON.parse(line));
      });
    });
  }

  async call(op: string, args: Record<string, unknown> = {}): Promise<any> {
    const answer = this.next();
    this.child.stdin!.write(JSON.stringify({ op, ...args }) + "\n");
    const reply = await answer;
    if ("error" in reply) throw new Error(`${reply.error[0]}: ${reply.error[1]}`);
    return reply.ok;
  }

  /** SIGKILL: a crashed instance (it hands nothing back). */
  async kill(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((resolve) => this.child.once("exit", resolve));
    this.child.kill("SIGKILL");
    await exited;
  }

  async close(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((resolve) => this.child.once("exit", resolve));
    await this.call("close", { timeout: 5 }).catch(() => this.child.kill("SIGKILL"));
    await exited;
  }
}
