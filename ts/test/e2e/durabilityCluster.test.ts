/** `durability: "replica"` on a real Redis Cluster (3 primaries, a replica each): the script and its
 * WAIT go to the node owning the customer's shard, through a slot migration (ASK, then MOVED), and
 * each event is on that node's replica when track() resolves; without the replica, NotDurable. */

import assert from "node:assert/strict";
import { after, afterEach, before, describe, it } from "node:test";
import { Cluster, Redis } from "ioredis";
import { Customer, customerPrefix } from "../../src/core/index.js";
import { slotOf } from "../../src/driver/cluster.js";
import { NotDurable, Outpost, type OutpostOptions } from "../../src/index.js";
import { fieldsOn, hasEvent } from "../support/customerFields.js";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { uniqueCustomer } from "../support/eventually.js";
import { RedisCluster } from "../support/redisCluster.js";
import { QUIET } from "../support/testOptions.js";

describe('durability: "replica" on a Redis Cluster (3 primaries, 3 replicas)', () => {
  let cluster: RedisCluster;
  let emulator: Emulator;
  let calls: string;
  const open: Outpost[] = [];
  const clients: (Redis | Cluster)[] = [];

  before(async () => {
    [cluster, emulator] = await Promise.all([RedisCluster.start(3, 1), Emulator.start()]);
    calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  });
  afterEach(async () => {
    await Promise.allSettled(open.splice(0).map((o) => o.close(2)));
    for (const client of clients.splice(0)) client.disconnect();
  });
  after(async () => Promise.all([cluster.stop(), emulator.stop()]));

  function connect(options: OutpostOptions = {}): Outpost {
    const outpost = new Outpost({ accessToken: emulator.token, serverUrl: emulator.url, redisUrl: cluster.url, telemetry: false, linger: 0.02, logger: QUIET, ...options });
    open.push(outpost);
    return outpost;
  }

  /** A client of the replica of the primary on `port`, reading (READONLY) what it holds. */
  async function replicaOf(port: number): Promise<Redis> {
    const [replica] = await cluster.replicaPorts(port);
    assert.ok(replica !== undefined, `the primary on ${port} has a replica`);
    const client = new Redis({ port: replica, readOnly: true, maxRetriesPerRequest: 1 });
    client.on("error", () => {});
    clients.push(client);
    return client;
  }

  const slotOfCustomer = (customer: string) => slotOf(customerPrefix(new Customer("external", customer)));

  it("tracks on the node owning the shard through a slot migration, each event on its replica", async () => {
    // A client of the test's own, whose slot map the test can make stale.
    const client = new Cluster([{ host: "127.0.0.1", port: cluster.livePorts()[0] as number }]);
    client.on("error", () => {});
    clients.push(client);
    const a = connect({ redis: client, durability: "replica", durabilityTimeout: 10 });
    const customer = uniqueCustomer();
    const who = { externalCustomerId: customer };
    await a.balance(calls, who);
    const slot = slotOfCustomer(customer);
    const source = await cluster.portForSlot(slot);
    const target = (await cluster.primaryPorts()).find((port) => port !== source) as number;
    const onSource = await replicaOf(source);
    const onTarget = await replicaOf(target);
    /** A track, then its event on `replica`. */
    const trackOnto = async (replica: Redis) => {
      const eventId = await a.track("api_call", who);
      assert.ok(hasEvent(await fieldsOn(replica, customer, true), eventId), `${eventId} on the replica`);
    };
    // No waiting here: WAIT made sure before each track() resolved.
    await trackOnto(onSource);
    await cluster.beginMigration(slot, target);
    await trackOnto(onSource); // the keys still on the source
    await cluster.moveKeys(slot, target);
    const asked = await a.track("api_call", who); // the source answers ASK
    await cluster.endMigration(slot, target);
    // As a client that has not looked at the slot map since: the source answers MOVED.
    (client.slots[slot] as string[])[0] = `127.0.0.1:${source}`;
    await trackOnto(onTarget); // MOVED, then the target
    // (The target's replica serves the slot's keys once the target owns it.)
    assert.ok(hasEvent(await fieldsOn(onTarget, customer, true), asked));
    assert.equal((await a.balance(calls, { ...who, fresh: true })).consumed, 4);
  });

  it("rejects with NotDurable, the event written once, when the owner's replica is gone", async () => {
    const customer = uniqueCustomer();
    const who = { externalCustomerId: customer };
    const owner = await cluster.portForSlot(slotOfCustomer(customer));
    const [replica] = await cluster.replicaPorts(owner);
    cluster.kill(replica as number);
    const b = connect({ durability: "replica", durabilityTimeout: 0.1 });
    await b.balance(calls, who);
    for (let attempt = 0; attempt < 2; attempt++) {
      await assert.rejects(b.track("api_call", { ...who, eventId: "lonely" }), (exc: unknown) => {
        assert.ok(exc instanceof NotDurable);
        assert.equal(exc.eventId, "lonely");
        assert.match(exc.message, /^event lonely is on the primary only: 0 of 1 replica\(s\) acknowledged the event within 100 ms$/);
        return true;
      });
      assert.equal((await b.balance(calls, { ...who, fresh: true })).consumed, 1);
    }
  });
});
