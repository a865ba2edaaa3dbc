/** The channel placement: which cluster node holds each shard channel's subscription, and what
 * the session hears of it (tests/core/test_placement.py, the same cases). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { UsageError } from "../../src/core/errors.js";
import { ChannelPlacement, type PlacementEffect, type PlacementInput } from "../../src/core/placement.js";

const CHANNELS = ["c0", "c1", "c2"];

function placed(owners: Record<string, string | null>): ChannelPlacement {
  const placement = new ChannelPlacement(CHANNELS);
  placement.handle({ kind: "SlotMapRead", owners });
  return placement;
}

const subscribe = (node: string, channel: string): PlacementEffect => ({ kind: "SubscribeOnNode", node, channel });
const unsubscribe = (node: string, channels: string[]): PlacementEffect => ({ kind: "UnsubscribeOnNode", node, channels });
const retire = (node: string): PlacementEffect => ({ kind: "RetireNode", node });
const lost = (channels: string[]): PlacementEffect => ({ kind: "ChannelsLost", channels });
const confirmed = (node: string, channel: string): PlacementInput => ({ kind: "NodeConfirmed", node, channel });

describe("the channel placement", () => {
  it("subscribes each channel on its owner at the first slot map", () => {
    const placement = placed({ c0: "a", c1: "b", c2: "a" });
    assert.deepEqual(placement.effects(), [subscribe("a", "c0"), subscribe("b", "c1"), subscribe("a", "c2")]);
    assert.ok(!placement.unplaced());
    assert.deepEqual(placement.effects(), []);
  });

  it("tells the session of a channel once its owner confirmed it", () => {
    const placement = placed({ c0: "a", c1: "b", c2: "a" });
    placement.effects();
    placement.handle(confirmed("a", "c0"));
    placement.handle(confirmed("b", "c0")); // not b's: a stale confirmation
    placement.handle(confirmed("z", "c1")); // no such node
    assert.deepEqual(placement.effects(), [{ kind: "ChannelSubscribed", channel: "c0" }]);
  });

  it("unsubscribes a moved slot, loses it, then subscribes it on its new owner", () => {
    const placement = placed({ c0: "a", c1: "b", c2: "a" });
    placement.effects();
    placement.handle({ kind: "SlotMapRead", owners: { c0: "a", c1: "b", c2: "b" } });
    assert.deepEqual(placement.effects(), [unsubscribe("a", ["c2"]), lost(["c2"]), subscribe("b", "c2")]);
    assert.ok(placement.heldBy("b", "c2") && !placement.heldBy("a", "c2"));
    placement.handle({ kind: "SlotMapRead", owners: { c0: "a", c1: "b", c2: "b" } });
    assert.deepEqual(placement.effects(), []); // nothing moved
  });

  it("retires a node left with no channel", () => {
    const placement = placed({ c0: "a", c1: "b", c2: "b" });
    placement.effects();
    placement.handle({ kind: "SlotMapRead", owners: { c0: "b", c1: "b", c2: "b" } });
    assert.deepEqual(placement.effects(), [unsubscribe("a", ["c0"]), lost(["c0"]), subscribe("b", "c0"), retire("a")]);
  });

  it("does not retire a node that gave everything up and owns it again", () => {
    const placement = placed({ c0: "a", c1: "a", c2: "a" });
    placement.effects();
    placement.handle({ kind: "NodeGaveUp", node: "a" }); // a client that says only that a slot moved
    assert.deepEqual(placement.effects(), [lost(["c0", "c1", "c2"])]);
    assert.ok(placement.unplaced());
    placement.handle({ kind: "SlotMapRead", owners: { c0: "a", c1: "a", c2: "a" } });
    assert.deepEqual(
      placement.effects(),
      CHANNELS.map((channel) => subscribe("a", channel)),
    );
  });

  it("lets a node give up only the channels it held", () => {
    const placement = placed({ c0: "a", c1: "b", c2: "a" });
    placement.effects();
    placement.handle({ kind: "NodeGaveUp", node: "a", channels: ["c1", "c2"] });
    assert.deepEqual(placement.effects(), [lost(["c2"])]);
    placement.handle({ kind: "NodeGaveUp", node: "a", channels: ["c2"] }); // told twice: lost once
    placement.handle({ kind: "NodeGaveUp", node: "z", channels: ["c0"] }); // no such node
    assert.deepEqual(placement.effects(), []);
    assert.ok(placement.unplaced());
  });

  it("loses a broken node's channels, and gives them to their owner at the next look", () => {
    const placement = placed({ c0: "a", c1: "b", c2: "a" });
    placement.effects();
    placement.handle({ kind: "NodeBroke", node: "a" });
    assert.deepEqual(placement.effects(), [lost(["c0", "c2"])]);
    placement.handle({ kind: "NodeBroke", node: "a" }); // dropped already
    placement.handle(confirmed("a", "c0")); // a confirmation that came late
    assert.deepEqual(placement.effects(), []);
    placement.handle({ kind: "SlotMapRead", owners: { c0: "c", c1: "b", c2: "c" } });
    assert.deepEqual(placement.effects(), [subscribe("c", "c0"), subscribe("c", "c2")]);
    assert.ok(!placement.unplaced());
  });

  it("leaves a slot no node serves unplaced until one does", () => {
    const placement = placed({ c0: "a", c1: null, c2: "a" });
    assert.deepEqual(placement.effects(), [subscribe("a", "c0"), subscribe("a", "c2")]);
    assert.ok(placement.unplaced());
    placement.handle({ kind: "SlotMapRead", owners: { c0: "a", c1: "b", c2: "a" } });
    assert.deepEqual(placement.effects(), [subscribe("b", "c1")]);
  });

  it("loses a channel whose slot becomes unserved", () => {
    const placement = placed({ c0: "a", c1: "b", c2: "a" });
    placement.effects();
    placement.handle({ kind: "SlotMapRead", owners: { c0: "a", c1: null, c2: "a" } });
    assert.deepEqual(placement.effects(), [unsubscribe("b", ["c1"]), lost(["c1"]), retire("b")]);
  });

  it("tells the driver at once that it misused the placement", () => {
    const placement = new ChannelPlacement(CHANNELS);
    assert.throws(() => placement.handle({ kind: "SlotMapRead", owners: { c0: "a" } }), (exc: unknown) => exc instanceof UsageError && /names no owner/.test(exc.message));
    assert.throws(() => placement.handle("tick" as unknown as PlacementInput), (exc: unknown) => exc instanceof UsageError && /not an input/.test(exc.message));
  });
});
