/** One instance's rule for Redis failures of its delivery loops and for re-reads of this
 * consumer's pending entries (tests/core/test_delivery_recovery.py). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { DeliveryRecovery, lostItsData } from "../../src/core/deliveryRecovery.js";
import { UsageError } from "../../src/core/errors.js";

const failed = (recovery: DeliveryRecovery, loop = 0, now = 100) => recovery.failed(loop, now, "Connection refused", 1, { lostData: false, closing: false });
const unreachable = (loop: number) => ({ level: "warning", message: `outpost: Redis unreachable for delivery ${loop}: Connection refused` });

describe("delivery recovery", () => {
  it("nothing is due before any failure", () => {
    const recovery = new DeliveryRecovery();
    assert.equal(recovery.nextRead(true), "no");
    assert.equal(recovery.failures, 0);
  });

  it("a failure in one loop has a loop re-read once all are idle, once", () => {
    const recovery = new DeliveryRecovery();
    failed(recovery, 1);
    // Loop 0 holds entries (a batch in flight): posted twice if a re-read took them too.
    assert.equal(recovery.nextRead(false), "waiting");
    assert.equal(recovery.nextRead(false), "waiting");
    assert.equal(recovery.nextRead(true), "now");
    assert.equal(recovery.nextRead(true), "no");
    assert.equal(recovery.failures, 1);
  });

  it("a re-read waits while a loop reads, claims or settles", () => {
    const recovery = new DeliveryRecovery();
    assert.equal(recovery.nextRead(true), "no");
    recovery.readStarted(); // loop 1 blocks in its read of new entries
    recovery.failedElsewhere(); // the subscription's connection dropped
    assert.equal(recovery.nextRead(true), "waiting");
    recovery.readStarted(); // loop 0 reads what is there without blocking
    recovery.readEnded();
    assert.equal(recovery.nextRead(true), "waiting"); // loop 1 still reads
    recovery.readEnded();
    assert.equal(recovery.nextRead(true), "now");
    assert.equal(recovery.failures, 1);
  });

  it("a failure elsewhere or a restart makes a re-read due", () => {
    const recovery = new DeliveryRecovery();
    recovery.failedElsewhere();
    assert.equal(recovery.nextRead(true), "now");
    recovery.restarted(2);
    assert.equal(recovery.nextRead(true), "now");
    assert.equal(recovery.failures, 1); // a restart is no Redis failure
  });

  it("a re-read that filled its count has a later read look again", () => {
    const recovery = new DeliveryRecovery();
    recovery.restarted(0);
    assert.equal(recovery.nextRead(true), "now");
    recovery.morePending();
    assert.equal(recovery.nextRead(false), "waiting");
    assert.equal(recovery.nextRead(true), "now");
    assert.equal(recovery.nextRead(true), "no");
  });

  it("lost data recreates the groups without backing off", () => {
    assert.ok(lostItsData("NOGROUP No such key 'outbox' or consumer group 'outpost'"));
    assert.ok(lostItsData("ERR no such key"));
    assert.ok(!lostItsData("Connection refused"));
    const recovery = new DeliveryRecovery();
    for (let i = 0; i < 5; i++) {
      const answer = recovery.failed(0, 100, "NOGROUP No such key", 0.5, { lostData: true, closing: false });
      assert.deepEqual(answer, { kind: "RecreateGroups", seconds: 0.05 });
    }
    assert.equal(recovery.answered(0, 101), null); // no outage began: nothing to say
    assert.equal(recovery.nextRead(true), "now");
    assert.equal(recovery.failures, 5);
  });

  it("the backoff grows per loop and resets when Redis answers", () => {
    const recovery = new DeliveryRecovery();
    assert.deepEqual(failed(recovery, 0, 100), { kind: "BackOff", seconds: 0.05, report: unreachable(0) });
    assert.deepEqual(failed(recovery, 0, 100.5), { kind: "BackOff", seconds: 0.1, report: null });
    assert.deepEqual(failed(recovery, 0, 101), { kind: "BackOff", seconds: 0.2, report: null });
    assert.deepEqual(failed(recovery, 1, 101), { kind: "BackOff", seconds: 0.05, report: unreachable(1) }); // each loop its own
    assert.deepEqual(failed(recovery, 0, 161), {
      kind: "BackOff",
      seconds: 0.4,
      report: { level: "warning", message: "outpost: Redis still unreachable for delivery 0 after 61 s: Connection refused" },
    });
    assert.deepEqual(recovery.answered(0, 162.5), { level: "info", message: "outpost: Redis is back for delivery 0 after 62.5 s" });
    assert.equal(recovery.answered(0, 163), null);
    assert.deepEqual(failed(recovery, 0, 170), { kind: "BackOff", seconds: 0.05, report: unreachable(0) });
    assert.equal(recovery.failures, 6);
  });

  it("a closing instance gives up and counts nothing", () => {
    const recovery = new DeliveryRecovery();
    assert.deepEqual(recovery.failed(0, 100, "Connection closed", 0.5, { lostData: false, closing: true }), { kind: "GiveUp" });
    assert.deepEqual(recovery.failed(0, 100, "NOGROUP", 0.5, { lostData: true, closing: true }), { kind: "GiveUp" });
    assert.equal(recovery.readBesidePostFailed(0, 100, "Connection closed", 0.5, { closing: true }), null);
    assert.equal(recovery.failures, 0);
    assert.equal(recovery.nextRead(true), "no");
    assert.equal(recovery.answered(0, 101), null);
  });

  it("a read beside a post that failed counts as its loop's failure, without a wait", () => {
    const recovery = new DeliveryRecovery();
    assert.deepEqual(recovery.readBesidePostFailed(3, 100, "Connection refused", 0.5, { closing: false }), unreachable(3));
    assert.deepEqual(failed(recovery, 3, 100.1), { kind: "BackOff", seconds: 0.1, report: null }); // the same outage
    assert.equal(recovery.nextRead(true), "now");
    assert.equal(recovery.failures, 2);
  });

  it("misuse throws at once", () => {
    const recovery = new DeliveryRecovery();
    assert.throws(() => recovery.readEnded(), UsageError);
    recovery.readStarted();
    recovery.readEnded();
    assert.throws(() => recovery.readEnded(), /readStarted/);
    assert.throws(() => failed(recovery, -1), /numbered from 0/);
    assert.throws(() => failed(recovery, 0.5), /numbered from 0/);
    assert.throws(() => recovery.answered(-1, 0), UsageError);
    assert.throws(() => recovery.restarted(-1), UsageError);
    assert.throws(() => recovery.readBesidePostFailed(-1, 0, "x", 0.5, { closing: false }), UsageError);
    assert.throws(() => recovery.failed(-1, 0, "x", 0.5, { lostData: false, closing: true }), UsageError);
    assert.equal(recovery.failures, 0);
  });
});
