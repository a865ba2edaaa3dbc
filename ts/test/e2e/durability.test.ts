/** `durability: "replica"`: track(), reserve() and a commit resolve once a replica holds what they
 * wrote (a real redis-server and its real `--replicaof` replica, the emulator of Polar), and reject
 * with NotDurable when none acknowledges in time: the event written, counted once, a retry with its
 * id writing nothing twice. As tests/drivers/_async/test_durability.py. */

import assert from "node:assert/strict";
import { after, afterEach, before, describe, it } from "node:test";
import { NotDurable, Outpost, type OutpostOptions, RedisUnavailable, UsageError } from "../../src/index.js";
import { fieldsOn, hasEvent, holds } from "../support/customerFields.js";
import { CALLS_FILTER, Emulator } from "../support/emulator.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { RedisReplica } from "../support/redisReplica.js";
import { RedisServer } from "../support/redisServer.js";
import { testOptions } from "../support/testOptions.js";

describe('durability: "replica" on one Redis and its replica', () => {
  let emulator: Emulator;
  let calls: string;
  let redis: RedisServer;
  let replica: RedisReplica;
  const open: Outpost[] = [];

  before(async () => {
    emulator = await Emulator.start();
    calls = await emulator.createMeter("calls", CALLS_FILTER, { func: "count" });
  });
  afterEach(async () => {
    await Promise.allSettled(open.splice(0).map((o) => o.close(2)));
    await Promise.all([replica?.stop(), redis?.stop()]);
  });
  after(async () => emulator.stop());

  /** A fresh primary and its replica for each test: a test kills the replica. */
  async function servers(): Promise<void> {
    redis = await RedisServer.start();
    replica = await RedisReplica.of(redis);
  }

  function connect(options: OutpostOptions = {}): Outpost {
    const outpost = new Outpost(testOptions(emulator, redis, options));
    open.push(outpost);
    return outpost;
  }

  /** Fresh servers, a new customer, and an instance with durability "replica" (`timeout`
   * seconds) that has read the customer. */
  async function replicaReading(timeout: number): Promise<[Outpost, string, { externalCustomerId: string }]> {
    await servers();
    const customer = uniqueCustomer();
    const who = { externalCustomerId: customer };
    const outpost = connect({ durability: "replica", durabilityTimeout: timeout });
    await outpost.balance(calls, who);
    return [outpost, customer, who];
  }

  async function consumed(outpost: Outpost, customer: string): Promise<number> {
    return (await outpost.balance(calls, { externalCustomerId: customer, fresh: true })).consumed;
  }

  it("resolves a track once the replica holds it; without the replica, NotDurable with the event's id, counted once", async () => {
    const [a, customer, who] = await replicaReading(10);
    const first = await a.track("api_call", who);
    // No waiting here: WAIT made sure before track() resolved.
    assert.ok(hasEvent(await fieldsOn(replica.client(), customer, true), first));
    replica.kill();
    const b = connect({ durability: "replica", durabilityTimeout: 0.1 });
    await assert.rejects(b.track("api_call", { ...who, eventId: "second" }), (exc: unknown) => {
      assert.ok(exc instanceof NotDurable && exc instanceof RedisUnavailable);
      assert.equal(exc.eventId, "second");
      assert.equal(exc.message, "event second is on the primary only: 0 of 1 replica(s) acknowledged the event within 100 ms");
      return true;
    });
    // Written on the primary all the same: it counts, and a retry writes nothing twice.
    assert.equal(await consumed(b, customer), 2);
    await assert.rejects(b.track("api_call", { ...who, eventId: "second" }), NotDurable);
    assert.equal(await consumed(b, customer), 2);
    // An id track() made up is in the error, for the retry.
    const made = await b.track("api_call", who).then(
      () => assert.fail("track() resolved without a replica"),
      (exc: unknown) => exc as NotDurable,
    );
    assert.ok(made instanceof NotDurable && made.eventId !== null && made.message.includes(made.eventId));
    await assert.rejects(b.track("api_call", { ...who, eventId: made.eventId }), NotDurable);
    assert.equal(await consumed(b, customer), 3);
    // Each instance's copy counts the events too (the replies reached the core).
    await eventually(async () => (await b.balance(calls, who)).consumed === 3, "b's copy counting the events");
  });

  it("holds up no other call while a track waits for its replica", async () => {
    const [a, customer, who] = await replicaReading(60);
    replica.kill();
    let settled = false;
    const waiting = a.track("api_call", who).finally(() => (settled = true));
    waiting.catch(() => {});
    // The script's reply came (a fresh read counts the event) while WAIT blocks its connection.
    const watcher = redis.client();
    await eventually(async () => String(await watcher.call("CLIENT", "LIST")).includes(" cmd=wait "), "the track's WAIT blocking");
    // Reads and other writes go on the instance's shared connection meanwhile.
    await eventually(async () => (await consumed(a, customer)) === 1, "a fresh read counting the event");
    const other = connect(); // "primary": no WAIT
    await other.track("api_call", who);
    assert.equal(await consumed(a, customer), 2);
    assert.equal(settled, false);
    await a.close(2);
    await assert.rejects(waiting, RedisUnavailable); // its connection closed with the instance
  });

  it("waits for the replica in reserve(), a commit and a conditional track too", async () => {
    await servers();
    const customer = uniqueCustomer();
    const who = { externalCustomerId: customer };
    await emulator.admin("credits", { meter_id: calls, units: 10, external_customer_id: customer });
    const a = connect({ durability: "replica", durabilityTimeout: 10 });
    await eventually(async () => (await a.balance(calls, who)).credited === 10, "the credits");
    const reservation = await a.reserve(calls, 1, who);
    // No waiting here: WAIT made sure before reserve() resolved.
    assert.equal(holds(await fieldsOn(replica.client(), customer, false)).length, 1);
    const committed = await reservation.commit("api_call");
    assert.ok(hasEvent(await fieldsOn(replica.client(), customer, true), committed));
    assert.deepEqual(holds(await fieldsOn(replica.client(), customer, false)), []);
    const admitted = await a.track("api_call", { ...who, requireBalance: true });
    assert.ok(hasEvent(await fieldsOn(replica.client(), customer, true), admitted));
    replica.kill();
    const b = connect({ durability: "replica", durabilityTimeout: 0.1 });
    await assert.rejects(b.reserve(calls, 1, who), (exc: unknown) => {
      assert.ok(exc instanceof NotDurable);
      assert.equal(exc.eventId, null); // a hold: no event to retry
      assert.match(exc.message, /^reserve is on the primary only: 0 of 1 replica/);
      return true;
    });
    await assert.rejects(b.track("api_call", { ...who, requireBalance: true }), (exc: unknown) => {
      assert.ok(exc instanceof NotDurable && exc.eventId !== null);
      assert.match(exc.message, new RegExp(`^event ${exc.eventId} \\(admit\\) is on the primary only`));
      return true;
    });
  });

  it("refuses a durability that does not exist, or a timeout that is not positive, at once", () => {
    const options = { redisUrl: "redis://127.0.0.1:1/0", telemetry: false };
    assert.throws(() => new Outpost({ ...options, durability: "disk" as "replica" }), (exc: unknown) => exc instanceof UsageError && exc.message === "durability must be 'primary' or 'replica', got 'disk'");
    assert.throws(() => new Outpost({ ...options, durability: "replica", durabilityTimeout: 0 }), UsageError);
  });
});
