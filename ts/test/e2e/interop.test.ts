/** One TypeScript and one Python instance on one Redis and one emulator: each reads what the other
 * tracked; delivery, settling and snapshots interoperate. */

import assert from "node:assert/strict";
import { before, describe, it } from "node:test";
import { Redis } from "ioredis";
import { Outpost, type OutpostOptions } from "../../src/index.js";
import { CALLS_FILTER } from "../support/emulator.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { PythonPeer } from "../support/pythonPeer.js";
import { world } from "../support/world.js";

describe("a TypeScript and a Python instance sharing one Redis", () => {
  const w = world();
  let tokens: string;

  before(async () => {
    tokens = await w.emulator.createMeter("tokens", CALLS_FILTER, { func: "sum", property: "tokens" });
  });

  function typescript(options: OutpostOptions = {}): Outpost {
    return w.connect(options);
  }

  async function python(options: Record<string, unknown> = {}): Promise<PythonPeer> {
    const peer = await PythonPeer.start({
      access_token: w.emulator.token,
      server_url: w.emulator.url,
      redis_url: w.redis.url,
      linger: 0.02,
      ...options,
    });
    w.closing(peer);
    return peer;
  }

  it("each reads what the other tracked", async () => {
    const ts = typescript();
    const py = await python();
    const customer = uniqueCustomer();
    const read = { meter_id: tokens, external_customer_id: customer };
    await ts.balance(tokens, { externalCustomerId: customer });
    await py.call("balance", read);
    await ts.track("api_call", { externalCustomerId: customer, metadata: { tokens: 5 } });
    await ts.track("api_call", { externalCustomerId: customer, metadata: { tokens: 2.5 } });
    await eventually(async () => (await py.call("balance", read)).consumed === 7.5, "Python to see the TypeScript events");
    await py.call("track", { name: "api_call", external_customer_id: customer, metadata: { tokens: 10 } });
    await eventually(async () => (await ts.balance(tokens, { externalCustomerId: customer })).consumed === 17.5, "TypeScript to see the Python event");
    // The Python instance delivers meanwhile: each acknowledgement moves the revision, and the two
    // reads can fall on either side of one. The copies converge on the same revision.
    let fromTs = await ts.balance(tokens, { externalCustomerId: customer });
    let fromPy = await py.call("balance", read);
    await eventually(async () => {
      fromTs = await ts.balance(tokens, { externalCustomerId: customer });
      fromPy = await py.call("balance", read);
      return fromTs.revision === fromPy.revision;
    }, "both copies at the same revision");
    assert.equal(fromTs.pending, 3);
    assert.equal(fromPy.pending, 3);
  });

  it("delivers each other's events, and both see them settled by Polar's snapshot", async () => {
    // The TypeScript instance has no token: only the Python one delivers, the TypeScript events too.
    const ts = typescript({ accessToken: "", serverUrl: w.emulator.url });
    const py = await python();
    const customer = uniqueCustomer();
    const read = { meter_id: w.calls, external_customer_id: customer };
    await py.call("balance", read); // Python asks Polar for the customer's snapshot
    await eventually(async () => {
      try {
        await ts.balance(w.calls, { externalCustomerId: customer });
        return true;
      } catch {
        return false;
      }
    }, "the TypeScript instance to read the snapshot Python applied");
    for (let i = 0; i < 3; i++) await ts.track("api_call", { externalCustomerId: customer, metadata: { i } });
    await py.call("track", { name: "api_call", external_customer_id: customer });
    assert.equal(await py.call("flush", { timeout: 10 }), true);
    assert.equal((await w.emulator.customerMeter(w.calls, customer)).consumed_units, 4);
    await eventually(async () => (await ts.balance(w.calls, { externalCustomerId: customer })).undelivered === 0, "the acknowledgements to reach TypeScript");
    assert.equal((await ts.balance(w.calls, { externalCustomerId: customer })).consumed, 4);
    assert.equal((await py.call("balance", read)).consumed, 4);
  });

  it("Python reads what the TypeScript instance delivered and the snapshots it applied", async () => {
    const ts = typescript();
    const py = await python({ access_token: "" });
    const customer = uniqueCustomer();
    const read = { meter_id: w.calls, external_customer_id: customer };
    await ts.balance(w.calls, { externalCustomerId: customer });
    await py.call("balance", read);
    await py.call("track", { name: "api_call", external_customer_id: customer });
    await ts.track("api_call", { externalCustomerId: customer });
    assert.equal(await ts.flush(10), true);
    assert.equal((await w.emulator.customerMeter(w.calls, customer)).consumed_units, 2);
    await w.emulator.admin("credits", { meter_id: w.calls, external_customer_id: customer, units: 50 });
    await eventually(async () => (await py.call("balance", read)).credited === 50, "Python to see the snapshot TypeScript applied");
    const fromPy = await py.call("balance", read);
    const fromTs = await ts.balance(w.calls, { externalCustomerId: customer });
    assert.equal(fromPy.consumed, 2);
    assert.equal(fromPy.undelivered, 0);
    assert.equal(fromPy.snapshot_id, fromTs.snapshotId);
    assert.equal(fromPy.balance, 48);
    assert.equal(fromTs.balance, 48);
  });

  it("a TypeScript instance takes over what a crashed Python instance held, once its heartbeat expired", async () => {
    const py = await python({ linger: 3600, heartbeat: 1 }); // it holds what it reads, unposted
    const customer = uniqueCustomer();
    for (let i = 0; i < 3; i++) await py.call("track", { name: "api_call", external_customer_id: customer });
    const probe = new Redis(w.redis.url);
    try {
      await eventually(async () => {
        let held = 0;
        for (let shard = 0; shard < 16; shard++) {
          held += Number(((await probe.xpending(`outpost:v2:{${shard}}:outbox`, "outpost")) as [number])[0]);
        }
        return held === 3;
      }, "the Python loop to read the events");
    } finally {
      probe.disconnect();
    }
    await py.kill();
    const ts = typescript({ heartbeat: 1 }); // claimIdle stays 300 s: only the heartbeat can tell
    await ts.start();
    await eventually(async () => (await w.emulator.customerMeter(w.calls, customer)).consumed_units === 3, "the Python events to reach Polar", 20);
    assert.equal(await ts.flush(10), true);
  });
});
