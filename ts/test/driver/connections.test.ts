/** What the driver calls a Redis failure, and how it finds a cluster's slots: no I/O. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Redis } from "ioredis";
import { clusterNodeUrl, slotOf } from "../../src/driver/cluster.js";
import { cannotConnect, describe as describeFailure } from "../../src/driver/connections.js";

describe("cluster URLs and slots", () => {
  it("takes redis+cluster:// and rediss+cluster:// as a cluster's node, anything else as one Redis", () => {
    assert.equal(clusterNodeUrl("redis+cluster://10.0.0.1:7000"), "redis://10.0.0.1:7000");
    assert.equal(clusterNodeUrl("rediss+cluster://:secret@h:7000"), "rediss://:secret@h:7000");
    assert.equal(clusterNodeUrl("redis://127.0.0.1:6379/0"), null);
    assert.equal(clusterNodeUrl("not a url"), null);
  });

  it("hashes keys to Redis Cluster's slots, by their hash tag when they have one", () => {
    assert.equal(slotOf("123456789"), 12739); // CRC16/XMODEM's check value, 0x31C3
    assert.equal(slotOf("foo"), 12182);
    assert.equal(slotOf("{user1000}.following"), slotOf("{user1000}.followers"));
    assert.equal(slotOf("{user1000}.following"), slotOf("user1000"));
    assert.equal(slotOf("foo{}{bar}"), slotOf("foo{}{bar}")); // an empty tag: the whole key
    assert.notEqual(slotOf("foo{}{bar}"), slotOf("bar"));
    assert.equal(slotOf("outpost:v2:{3}:changes"), slotOf("3"));
  });
});

describe("Redis failures in an operator's words", () => {
  const client = new Redis({ host: "10.1.2.3", port: 6390, lazyConnect: true });

  it("names a refused connection, a name that does not resolve, a timeout", () => {
    const refused = Object.assign(new Error("connect ECONNREFUSED 10.1.2.3:6390"), { code: "ECONNREFUSED" });
    assert.equal(cannotConnect(refused, "10.1.2.3", 6390), "cannot connect to 10.1.2.3:6390: connection refused (nothing listens there)");
    const unknown = Object.assign(new Error("getaddrinfo ENOTFOUND redis.invalid"), { code: "ENOTFOUND" });
    assert.equal(cannotConnect(unknown, "redis.invalid", 6379), "cannot connect to redis.invalid:6379: the name does not resolve");
    assert.equal(describeFailure(Object.assign(new Error("connect ETIMEDOUT"), { code: "ETIMEDOUT" }), client), "cannot connect to 10.1.2.3:6390: timed out");
  });

  it("names the connection's failure, not the client's option, when a queued command gave up", () => {
    const gaveUp = Object.assign(new Error('Reached the max retries per request limit (which is 0). Refer to "maxRetriesPerRequest" option for details.'), { name: "MaxRetriesPerRequestError" });
    const text = describeFailure(gaveUp, client);
    assert.doesNotMatch(text, /maxRetriesPerRequest/);
    assert.equal(text, "the connection to Redis closed");
  });

  it("keeps a reply error's own words", () => {
    const reply = Object.assign(new Error("NOGROUP No such key"), { name: "ReplyError" });
    assert.equal(describeFailure(reply, client), "ReplyError: NOGROUP No such key");
  });

  it("never quotes a URL's password", () => {
    const quoting = new Error("could not use redis://:hunter2@10.1.2.3:6390/0");
    assert.equal(describeFailure(quoting, client), "could not use redis://:***@10.1.2.3:6390/0");
  });
});
