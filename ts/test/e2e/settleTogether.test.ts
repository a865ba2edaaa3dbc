/** A delivery loop settles the acknowledged entries of batches that follow each other in one
 * script per stream. A real redis-server and the emulator; the backlog is queued whole before the
 * loop acts (its actions wait for the test). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { DeliveryEffect, DeliveryInput } from "../../src/core/index.js";
import { Customer, shardOf } from "../../src/core/keys.js";
import { Outpost, type OutpostOptions } from "../../src/index.js";
import { uniqueCustomer } from "../support/eventually.js";
import { world } from "../support/world.js";

type Act = (...args: unknown[]) => Promise<DeliveryInput>;
/** What these tests look at inside an instance. */
interface Inside {
  ensureStarted(): Promise<void>;
  ctx: { deliveries: { effects: () => DeliveryEffect[] }[] };
  /** The delivery loops (delivery.ts): each action goes through act(). */
  delivery: { act: Act };
}
const inside = (outpost: Outpost): Inside => outpost as unknown as Inside;

describe("settling batches that follow each other together", () => {
  const w = world();

  /** A started instance (no request budget: every batch goes at once) whose delivery loop waits,
   * before its next action, until `release()`; and every action the loop asks for from then on. */
  async function held(options: OutpostOptions): Promise<[Outpost, DeliveryEffect[], () => void]> {
    const outpost = w.connect({ requestsPerMinute: 0, ...options });
    const o = inside(outpost);
    const act = o.delivery.act.bind(o.delivery) as Act;
    let release = (): void => {};
    const gate = new Promise<void>((resolve) => (release = resolve));
    o.delivery.act = async (...args) => {
      await gate;
      return act(...args);
    };
    await o.ensureStarted();
    const machine = o.ctx.deliveries[0]!;
    const effects = machine.effects.bind(machine);
    const actions: DeliveryEffect[] = [];
    machine.effects = () => {
      const drained = effects();
      actions.push(...drained);
      return drained;
    };
    return [outpost, actions, release];
  }

  /** `perCustomer` events for each of `customers` new customers, all queued. */
  async function backlog(outpost: Outpost, customers: number, perCustomer: number): Promise<string[]> {
    const names = Array.from({ length: customers }, () => uniqueCustomer("together"));
    await outpost.balance(w.calls, { externalCustomerId: names[0] as string }).catch(() => null); // the configuration first
    await Promise.all(names.flatMap((customer) => Array.from({ length: perCustomer }, () => outpost.track("api_call", { externalCustomerId: customer }))));
    return names;
  }

  async function consumed(names: string[]): Promise<number[]> {
    return Promise.all(names.map(async (customer) => (await w.emulator.customerMeter(w.calls, customer)).consumed_units as number));
  }

  /** The customers of each batch the loop posted. */
  function batches(actions: DeliveryEffect[]): string[][] {
    const posts = actions.flatMap((a) => (a.kind === "PostAndSettle" ? [a.post] : a.kind === "PostBatch" ? [a] : []));
    return posts.map((p) => (JSON.parse(new TextDecoder().decode(p.body)).events as { external_customer_id: string }[]).map((e) => e.external_customer_id));
  }

  it("delivers a backlog exactly, in fewer settle scripts than its batches settled each alone", async () => {
    const [outpost, actions, release] = await held({ batchSize: 10 });
    const names = await backlog(outpost, 30, 20);
    release();
    assert.equal(await outpost.flush(30), true);
    assert.deepEqual(await consumed(names), names.map(() => 20));
    const posted = batches(actions);
    assert.equal(posted.flat().length, 600);
    const settles = actions.flatMap((a) => (a.kind === "PostAndSettle" || a.kind === "SettleScripts" ? a.settles : a.kind === "SettleScript" ? [a] : []));
    assert.ok(settles.every((s) => s.script === "acknowledge"));
    // A batch settled alone takes one script for each stream it touched.
    const alone = posted.reduce((n, batch) => n + new Set(batch.map((c) => shardOf(new Customer("external", c)))).size, 0);
    const streams = new Set(settles.map((s) => s.keys[0])).size;
    assert.ok(settles.length < alone, `${settles.length} settle scripts for ${posted.length} batches (${alone} if each settled alone)`);
    assert.ok(settles.length < posted.length * streams);
  });
});
