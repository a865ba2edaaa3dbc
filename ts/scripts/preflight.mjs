// Run by `npm test` before anything else: the end-to-end tests need redis-server on the PATH and
// the Python emulator of Polar from the repository's .venv. Without them, say what to run in one
// line and stop within seconds, rather than let every test file time out on its own.
import { spawn, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const outpost = join(repo, ".venv", "bin", "outpost");
const WAIT = 20; // seconds the emulator may take to answer

function fail(why) {
  console.error(`npm test: ${why}`);
  process.exit(1);
}

if (spawnSync("redis-server", ["--version"], { stdio: "ignore" }).error) {
  fail("redis-server is not on the PATH: install Redis 7+ (the tests start their own servers)");
}
if (!existsSync(outpost)) {
  fail(`${outpost} is missing: run ./dev true at the repository root first (it creates .venv with the emulator)`);
}

const port = await new Promise((resolve, reject) => {
  const server = createServer();
  server.once("error", reject);
  server.listen(0, "127.0.0.1", () => {
    const { port } = server.address();
    server.close(() => resolve(port));
  });
});
const child = spawn(outpost, ["emulator", "--host", "127.0.0.1", "--port", String(port), "--log-level", "warning"], { stdio: ["ignore", "ignore", "pipe"] });
let log = "";
child.stderr.on("data", (chunk) => (log = (log + chunk).slice(-2000)));
let exited = false;
child.once("exit", () => (exited = true));
child.once("error", (exc) => fail(`the emulator (${outpost}) cannot start: ${exc.message}; run ./dev true at the repository root`));
const deadline = Date.now() + WAIT * 1000;
for (;;) {
  if (exited) {
    const last = log.trim().split("\n").at(-1) ?? "";
    fail(`the emulator (${outpost} emulator) exited at start${last ? ` (${last})` : ""}: run ./dev true at the repository root`);
  }
  try {
    if ((await fetch(`http://127.0.0.1:${port}/__emulator/clock`)).ok) break;
  } catch {
    // not listening yet
  }
  if (Date.now() > deadline) {
    child.kill("SIGKILL");
    fail(`the emulator did not answer within ${WAIT} s: run ./dev true at the repository root, then try again`);
  }
  await new Promise((resolve) => setTimeout(resolve, 100));
}
child.kill("SIGTERM");
