/** A delivery loop reads the next batch while one is posted: a backlog over many customers is
 * delivered whole, and a read beside a post whose reply Redis never delivered loses nothing (its
 * entries, pending for this consumer, are read again). A real redis-server and the emulator. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { Redis } from "ioredis";
import type { DeliveryEffect } from "../../src/core/index.js";
import { Outpost, type OutpostOptions } from "../../src/index.js";
import { eventually, uniqueCustomer } from "../support/eventually.js";
import { Lines } from "../support/lines.js";
import { world } from "../support/world.js";

/** What these tests look at inside an instance. */
interface Inside {
  ensureStarted(): Promise<void>;
  ctx: { deliveries: { effects: () => DeliveryEffect[] }[]; connections: Redis[] };
}
const inside = (outpost: Outpost): Inside => outpost as unknown as Inside;
/** XREADGROUP's reply when it found nothing (RESP2). */
const EMPTY_READ = "*-1\r\n";

describe("reading the next batch while one is posted", () => {
  const w = world();

  const { connect } = w;

  /** `perCustomer` events for each of `customers` new customers, tracked by `outpost` at once. */
  async function backlog(outpost: Outpost, customers: number, perCustomer: number): Promise<string[]> {
    const names = Array.from({ length: customers }, () => uniqueCustomer("backlog"));
    await outpost.balance(w.calls, { externalCustomerId: names[0] as string }).catch(() => null); // the configuration first
    await Promise.all(names.flatMap((customer) => Array.from({ length: perCustomer }, () => outpost.track("api_call", { externalCustomerId: customer }))));
    return names;
  }

  /** A started instance, and every action its delivery loop asks for from now on (`seen` is told
   * of each as it is asked for). */
  async function delivering(options: OutpostOptions, seen: (action: DeliveryEffect) => void = () => {}): Promise<[Outpost, DeliveryEffect[]]> {
    const outpost = connect(options);
    await inside(outpost).ensureStarted();
    const machine = inside(outpost).ctx.deliveries[0]!;
    const effects = machine.effects.bind(machine);
    const actions: DeliveryEffect[] = [];
    machine.effects = () => {
      const drained = effects();
      actions.push(...drained);
      drained.forEach(seen);
      return drained;
    };
    return [outpost, actions];
  }

  async function consumed(names: string[]): Promise<number[]> {
    return Promise.all(names.map(async (customer) => (await w.emulator.customerMeter(w.calls, customer)).consumed_units as number));
  }

  it("delivers a backlog over many customers on flush(), reading each next batch beside a post", async () => {
    const [outpost, actions] = await delivering({ batchSize: 50 });
    const names = await backlog(outpost, 30, 20);
    assert.equal(await outpost.flush(30), true);
    assert.deepEqual(await consumed(names), names.map(() => 20));
    const beside = actions.filter((a) => a.kind === "PostAndSettle" && a.read);
    assert.ok(beside.length >= 1, `no post carried a read among ${actions.length} actions`);
  });

  it("loses nothing when the reply of a read beside a post is lost after Redis ran it", async () => {
    const lines = new Lines();
    let socket: Redis["stream"] | null = null; // the loop's connection, its reply held back
    let lost = false;
    const [outpost, actions] = await delivering({ batchSize: 20, logger: lines.logger }, (action) => {
      if (lost || socket !== null || action.kind !== "PostAndSettle" || !action.read) return;
      // The loop's next command is this read: once it is written, its reply is held back (the
      // socket paused) until the test decides below.
      const held = inside(outpost).ctx.connections[0]!.stream;
      const write = held.write.bind(held) as (...args: unknown[]) => boolean;
      held.write = ((...args: unknown[]) => {
        const written = write(...args);
        if (/xreadgroup/i.test(String(args[0]))) {
          held.write = write as typeof held.write;
          held.pause();
          socket = held;
        }
        return written;
      }) as typeof held.write;
    });
    const tracking = backlog(outpost, 10, 30);
    await eventually(() => {
      if (socket === null || socket.readableLength === 0) return false;
      if (socket.readableLength === EMPTY_READ.length) {
        socket.resume(); // it found nothing: let it through, and hold the next one
        socket = null;
        return false;
      }
      socket.destroy(); // Redis gave entries to this consumer; the loop never hears which
      lost = true;
      return true;
    }, "a read beside a post that took entries, its reply held back");
    const names = await tracking;
    await eventually(() => lines.at("warn").some((l) => l.includes("delivery 0")), "the loop saying Redis failed it");
    assert.equal(await outpost.flush(30), true);
    assert.deepEqual(await consumed(names), names.map(() => 30));
    assert.ok(actions.some((a) => a.kind === "PostAndSettle" && a.read));
  });
});
