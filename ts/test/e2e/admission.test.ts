/** Exact admission across SDKs: a TypeScript and a Python instance on one Redis share the same
 * holds; each refuses what the other's holds leave uncovered, and sees them come and go. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { InsufficientBalance } from "../../src/index.js";
import { CALLS_FILTER } from "../support/emulator.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { PythonPeer } from "../support/pythonPeer.js";
import { world } from "../support/world.js";

describe("admission shared by a TypeScript and a Python instance", () => {
  const w = world();


  it("each sees the other's holds and refuses what they leave uncovered", async () => {
    const ts = w.connect();
    const py = await PythonPeer.start({ access_token: w.emulator.token, server_url: w.emulator.url, redis_url: w.redis.url, linger: 0.02 });
    w.closing(py);
    const customer = uniqueCustomer();
    await w.emulator.admin("credits", { meter_id: w.calls, units: 10, external_customer_id: customer });
    const read = { meter_id: w.calls, external_customer_id: customer };
    const who = { externalCustomerId: customer };
    await eventually(async () => (await ts.balance(w.calls, who)).credited === 10, "the credits");
    await eventually(async () => (await py.call("balance", read)).credited === 10, "the credits in Python");

    const mine = await ts.reserve(w.calls, 6, who);
    await eventually(async () => (await py.call("balance", read)).held === 6, "Python to see the TypeScript hold");
    await assert.rejects(py.call("reserve", { ...read, units: 5 }), /InsufficientBalance/);
    const theirs = await py.call("reserve", { ...read, units: 4 });
    await eventually(async () => (await ts.balance(w.calls, who)).held === 10, "TypeScript to see the Python hold");
    await assert.rejects(ts.reserve(w.calls, 1, who), (exc: unknown) => exc instanceof InsufficientBalance && exc.available === 0);
    await assert.rejects(ts.track("api_call", { ...who, requireBalance: true }), InsufficientBalance);

    await py.call("commit", { reservation: theirs, name: "api_call" });
    await eventually(async () => {
      const b = await ts.balance(w.calls, who);
      return b.held === 6 && b.consumed === 1 && b.available === 3;
    }, "TypeScript to see the commit");
    await mine.release();
    await eventually(async () => (await py.call("balance", read)).available === 9, "Python to see the release");
    await ts.track("api_call", { ...who, requireBalance: true });
    assert.equal((await ts.balance(w.calls, who)).available, 8);
  });
});
