/** The invariant of docs/invariant.md as a fast-check property, the TypeScript counterpart of
 * tests/conformance/test_model.py (smaller: snapshots are applied as the driver applies them,
 * without the WebSocket flow, which the traces cover).
 *
 * Real: two Sessions (A applies replies of its own writes and snapshots; B only follows the
 * channel), the real Delivery policy, the real scripts on a real redis-server, pub/sub through
 * SSUBSCRIBE. Modelled: Polar (stored events, syncs that make buckets cold, snapshots computed at
 * one moment and applied later, late, twice or never, the `counted` answer as of the snapshot).
 *
 * After every step: for every customer and reducer, the local aggregate in Redis (Polar's totals
 * before cold_until with every `a:` bucket) is at least Polar's eventual aggregate of the events
 * it stored (count, sum of non-negative values, max). At quiescence (everything delivered, time
 * past every bucket and the pending limit, one fresh snapshot applied): equal, nothing pending,
 * and both instances read what Redis holds. Polar's assumptions, as in Python: a closed bucket
 * syncs within 45 minutes, a snapshot is applied within ten minutes of as_of. */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import fc from "fast-check";
import type { Redis } from "ioredis";
import { Aggregate, EMPTY } from "../../src/core/aggregate.js";
import { Balance } from "../../src/core/balance.js";
import { Delivery, type DeliveryInput, makeDeliverySettings, withKnownRevs } from "../../src/core/delivery.js";
import type { Effect } from "../../src/core/effects.js";
import type { Input } from "../../src/core/inputs.js";
import { Customer, ackedKey, allChannels, allOutboxes, bucketKey, channel, shardOf, stateKey } from "../../src/core/keys.js";

const ALL_OUTBOXES = allOutboxes();
import { PythonRandom } from "../../src/core/random.js";
import { Session, makeSettings } from "../../src/core/session.js";
import { BUCKET_US, HOUR_US, floorBucket } from "../../src/core/time.js";
import { SCRIPT_TEXT } from "../../src/core/scripts.generated.js";
import { composeScript } from "../../scripts/gen-scripts.js";
import { CONFORMANCE, REPO } from "../support/paths.js";
import { RedisServer, waitFor } from "../support/redisServer.js";
import { answerAt, effectAt } from "../support/deliveryLoop.js";

const MINUTE = 60_000_000;
const CUSTOMERS = ["c1", "c2"];
const CONFIGURATION = {
  organization_id: "org",
  reducers: [
    { id: "r-count", filter: { conjunction: "and", clauses: [{ property: "name", operator: "eq", value: "api_call" }] }, aggregation: { func: "count" }, meter_ids: ["m-count"] },
    { id: "r-tokens", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "sum", property: "tokens" }, meter_ids: ["m-tokens"] },
    { id: "r-largest", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "max", property: "tokens" }, meter_ids: ["m-largest"] },
  ],
};
const REDUCERS = ["r-count", "r-tokens", "r-largest"];
const SENTINEL = "outpost:model:sentinel";

interface Stored {
  customer: string;
  bucket: number;
  name: string;
  tokens: number | undefined;
  synced: boolean;
}

interface PolarSnapshot {
  id: string;
  customer: string;
  asOf: number;
  coldUntil: number;
  totals: Map<string, Aggregate>;
  counted: Set<string>;
}

type Fate = "accept" | "lost" | "timeout" | "reject" | "unavailable";
type Step =
  | { kind: "track"; customer: number; name: string; tokens: number | null; age: number; again: boolean }
  | { kind: "deliver"; fates: Fate[] }
  | { kind: "advance"; minutes: number; onTime: boolean }
  | { kind: "sync"; lag: number }
  | { kind: "compute"; customer: number }
  | { kind: "apply"; which: number }
  | { kind: "messages"; instance: number; mode: "order" | "twice" | "reverse" | "lose" }
  | { kind: "read"; instance: number; customer: number; meter: number };

const step: fc.Arbitrary<Step> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ kind: fc.constant("track" as const), customer: fc.nat(1), name: fc.constantFrom("api_call", "other"), tokens: fc.option(fc.constantFrom(0, 1, 2.5, 7), { nil: null }), age: fc.nat(2), again: fc.boolean() }) },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant("deliver" as const), fates: fc.array(fc.constantFrom<Fate>("accept", "accept", "lost", "timeout", "reject", "unavailable"), { minLength: 1, maxLength: 3 }) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("advance" as const), minutes: fc.integer({ min: 1, max: 9 }), onTime: fc.boolean() }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("sync" as const), lag: fc.nat(2) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("compute" as const), customer: fc.nat(1) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("apply" as const), which: fc.nat(5) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("messages" as const), instance: fc.nat(1), mode: fc.constantFrom("order" as const, "order" as const, "twice" as const, "reverse" as const, "lose" as const) }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("read" as const), instance: fc.nat(1), customer: fc.nat(1), meter: fc.nat(2) }) },
);

const contribution = (reducer: string, name: string, tokens: number | undefined): number | null =>
  reducer === "r-count" ? (name === "api_call" ? 1 : null) : tokens === undefined ? null : tokens;

class World {
  nowUs = 1_796_000_000_000_000 + 37 * 1_000_000;
  seconds = 1000;
  readonly stored = new Map<string, Stored>();
  syncedUntil = 0;
  readonly snapshots: PolarSnapshot[] = [];
  readonly sessions = [new Session(makeSettings()), new Session(makeSettings())];
  readonly queues: string[][] = [[], []];
  readonly delivery = new Delivery(makeDeliverySettings({ batchSize: 3, linger: 0, maxAttempts: 2, backoffBase: 0.01, backoffCap: 0.05, claimInterval: 1e9 }), new PythonRandom(7), this.seconds);
  tracked: string[] = [];
  dropped = new Set<string>();
  ids = 0;

  constructor(
    readonly redis: Redis,
    readonly published: string[],
    readonly texts: Readonly<Record<string, string>> = SCRIPT_TEXT,
  ) {}

  async start(): Promise<void> {
    for (const session of this.sessions) {
      await this.handle(session, { kind: "SubscriberRestarted" }); // the copies follow Redis
      await this.handle(session, { kind: "ConfigurationReceived", payload: CONFIGURATION, fromCache: false });
    }
    for (const stream of ALL_OUTBOXES) await this.redis.xgroup("CREATE", stream, "outpost", "0", "MKSTREAM");
  }

  async handle(session: Session, input: Input): Promise<void> {
    session.handle(input);
    await this.run(session, session.effects());
  }

  async run(session: Session, effects: Effect[]): Promise<void> {
    while (effects.length) {
      for (const effect of effects) {
        if (effect.kind === "LoadIdentity") {
          session.handle({ kind: "IdentityLoaded", key: effect.key, fields: await this.redis.hgetall(effect.key), loadId: effect.loadId });
        } else if (effect.kind === "RunScript") {
          session.handle({ kind: "ScriptReplied", reply: await this.script(effect.script, effect.keys, effect.args), tag: effect.tag });
        } else if (effect.kind === "StoreConfiguration") {
          await this.redis.set(effect.key, effect.text);
        }
      }
      effects = session.effects();
    }
  }

  async script(name: string, keys: string[], args: string[]): Promise<unknown> {
    const reply = await this.redis.eval(this.texts[name] as string, keys.length, ...keys, ...args);
    // Every message the script published, to both instances' queues, in order.
    await this.redis.spublish(SENTINEL, "x");
    await waitFor("the sentinel", () => (this.published.includes(SENTINEL) ? true : undefined));
    for (const message of this.published.splice(0)) {
      if (message !== SENTINEL) for (const queue of this.queues) queue.push(message);
    }
    return reply;
  }

  // -- steps ----------------------------------------------------------------------------------

  async track(s: Extract<Step, { kind: "track" }>): Promise<void> {
    const again = s.again && this.tracked.length > 0;
    const eventId = again ? (this.tracked[this.tracked.length - 1] as string) : `e${++this.ids}`;
    const [customer, timestampUs] = again ? this.lastTrack : [CUSTOMERS[s.customer] as string, Math.max(0, this.nowUs - s.age * BUCKET_US)];
    const tokens = again ? this.lastTokens.get(eventId) : (s.tokens ?? undefined);
    const metadata = tokens === undefined ? {} : { tokens };
    const name = again ? this.lastName : s.name;
    const a = this.sessions[0] as Session;
    const run = a.track({ name, externalCustomerId: customer, metadata, timestampUs, nowUs: this.nowUs, eventId });
    const reply = await this.script(run.script, run.keys, run.args);
    await this.handle(a, { kind: "ScriptReplied", reply, tag: null });
    if (!again) {
      this.tracked.push(eventId);
      this.lastTrack = [customer, timestampUs];
      this.lastName = name;
      this.lastTokens.set(eventId, tokens);
    }
  }
  lastTrack: [string, number] = ["c1", 0];
  lastName = "api_call";
  lastTokens = new Map<string, number | undefined>();

  private store(body: Uint8Array): void {
    const { events } = JSON.parse(new TextDecoder().decode(body)) as { events: Record<string, any>[] };
    for (const event of events) {
      if (this.stored.has(event.external_id)) continue; // Polar de-duplicates on external_id
      const timestampUs = Date.parse(event.timestamp) * 1000 + Number(String(event.timestamp).slice(23, 26));
      this.stored.set(event.external_id, {
        customer: event.external_customer_id,
        bucket: floorBucket(timestampUs),
        name: event.name,
        tokens: typeof event.metadata?.tokens === "number" ? event.metadata.tokens : undefined,
        synced: false,
      });
    }
  }

  async deliver(fates: Fate[]): Promise<void> {
    const a = this.sessions[0] as Session;
    const remaining = [...fates];
    for (let polls = 0; polls < 40; polls++) {
      this.delivery.handle({ kind: "Flushing", on: true });
      const action = effectAt(this.delivery, this.seconds);
      let outcome: DeliveryInput;
      let stop = false;
      switch (action.kind) {
        case "ClaimStale":
        case "RefreshClaim":
          outcome = action.kind === "ClaimStale" ? { kind: "OutboxRead", entries: [] } : { kind: "Done" };
          break;
        case "ReadOutbox": {
          const xreadgroup = this.redis.xreadgroup.bind(this.redis) as unknown as (...a: (string | number)[]) => Promise<any>;
          const reply = (await xreadgroup("GROUP", "outpost", "w", "COUNT", action.count, "STREAMS", ...ALL_OUTBOXES, ...ALL_OUTBOXES.map(() => ">"))) ?? [];
          const entries: [string, string, Map<string, string>][] = [];
          for (const [stream, listing] of reply) {
            for (const [id, flat] of listing) {
              const fields = new Map<string, string>();
              for (let i = 0; i < flat.length; i += 2) fields.set(flat[i], flat[i + 1]);
              entries.push([stream, id, fields]);
            }
          }
          outcome = { kind: "OutboxRead", entries };
          stop = entries.length === 0 && this.delivery.idle;
          break;
        }
        case "PostBatch": {
          const fate = remaining.shift();
          const events = (JSON.parse(new TextDecoder().decode(action.body)) as { events: { external_id: string }[] }).events;
          if (fate === undefined) {
            outcome = { kind: "BatchFailed", reason: "unreachable", maybeSent: false };
            stop = true;
          } else if (fate === "accept") {
            this.store(action.body);
            outcome = { kind: "BatchAnswered", status: 200, body: new Uint8Array(), retryAfter: null };
          } else if (fate === "lost") {
            this.store(action.body);
            outcome = { kind: "BatchFailed", reason: "reset", maybeSent: true };
          } else if (fate === "timeout") {
            outcome = { kind: "BatchFailed", reason: "timeout", maybeSent: true };
          } else if (fate === "unavailable") {
            outcome = { kind: "BatchAnswered", status: 503, body: new Uint8Array(), retryAfter: null };
          } else {
            // Polar never refuses an event it stored: a batch it holds whole is a success.
            const bad = events.findIndex((e) => !this.stored.has(e.external_id));
            if (bad < 0) {
              outcome = { kind: "BatchAnswered", status: 200, body: new Uint8Array(), retryAfter: null };
            } else {
              const detail = [{ loc: ["body", "events", bad, "name"], msg: "refused" }];
              outcome = { kind: "BatchAnswered", status: 422, body: new TextEncoder().encode(JSON.stringify({ detail })), retryAfter: null };
            }
          }
          break;
        }
        case "SettleScript": {
          const call = withKnownRevs(action, (state) => a.knownRev(state));
          const reply = await this.script(call.script, call.keys, call.args);
          await this.handle(a, { kind: "ScriptReplied", reply, tag: null });
          outcome = { kind: "Settled", reply };
          break;
        }
        case "ReportDropped":
          for (const event of action.events as { external_id: string }[]) this.dropped.add(event.external_id);
          outcome = { kind: "Reported" };
          break;
        case "Sleep":
          outcome = { kind: "Done" };
          stop = remaining.length === 0;
          this.seconds = Math.max(this.seconds, action.until); // the wait passes (wall time barely)
          break;
        default:
          throw new Error(`no liveness or budget in this model: ${action.kind}`);
      }
      answerAt(this.delivery, outcome, this.seconds, this.nowUs);
      if (stop) return;
    }
  }

  advance(minutes: number): void {
    this.nowUs += minutes * MINUTE;
    this.seconds += minutes * 60;
    // Polar's assumption: a closed bucket syncs within 45 minutes.
    this.sync(Math.max(this.syncedUntil, floorBucket(this.nowUs - 40 * MINUTE)));
  }

  sync(until: number): void {
    this.syncedUntil = Math.max(this.syncedUntil, until);
    for (const event of this.stored.values()) if (event.bucket < this.syncedUntil) event.synced = true;
  }

  compute(customer: string): void {
    const totals = new Map<string, Aggregate>(REDUCERS.map((r) => [r, EMPTY]));
    const counted = new Set<string>();
    for (const [id, event] of this.stored) {
      if (event.customer !== customer || !event.synced) continue;
      counted.add(id);
      for (const reducer of REDUCERS) {
        const value = contribution(reducer, event.name, event.tokens);
        if (value !== null) totals.set(reducer, (totals.get(reducer) as Aggregate).add(value));
      }
    }
    this.snapshots.push({ id: `s${this.snapshots.length + 1}`, customer, asOf: this.nowUs, coldUntil: this.syncedUntil, totals, counted });
  }

  async apply(snapshot: PolarSnapshot): Promise<void> {
    if (this.nowUs - snapshot.asOf > 10 * MINUTE) return; // snapshot_expired: the core asks again
    const a = this.sessions[0] as Session;
    const customer = new Customer("external", snapshot.customer);
    const keys: string[] = [];
    const args = [channel(shardOf(customer)), String(this.nowUs), String(HOUR_US), String(snapshot.coldUntil), String(snapshot.asOf), snapshot.id, "1", "m-count", "10"];
    for (const [reducer, aggregate] of snapshot.totals) {
      const state = stateKey(customer, reducer);
      // The buckets the state hash indexes (its a: fields), then their events.
      const buckets = (await this.redis.hkeys(state)).filter((f) => f.startsWith("a:")).map((f) => f.slice(2));
      const pending: string[] = [];
      for (const bucket of buckets) pending.push(...(await this.redis.hkeys(bucketKey(state, bucket))));
      const counted = pending.filter((f) => Number(f.split(":")[0]) < snapshot.coldUntil && snapshot.counted.has(f.split(":")[1] as string));
      keys.push(state, ackedKey(state));
      args.push(String(a.knownRev(state)), aggregate.encode(), String(counted.length), ...counted);
    }
    const reply = await this.script("apply_snapshot", keys, args);
    await this.handle(a, { kind: "ScriptReplied", reply, tag: null });
  }

  async messages(instance: number, mode: string): Promise<void> {
    const session = this.sessions[instance] as Session;
    const queue = (this.queues[instance] as string[]).splice(0);
    if (mode === "lose") {
      session.handle({ kind: "SubscriberLost" });
      return this.handle(session, { kind: "SubscriberRestarted" });
    }
    const order = mode === "reverse" ? [...queue].reverse() : mode === "twice" ? queue.flatMap((m) => [m, m]) : queue;
    for (const data of order) await this.handle(session, { kind: "ChangePublished", data });
  }

  async read(instance: number, customer: string, meter: string): Promise<void> {
    const session = this.sessions[instance] as Session;
    let balance = await this.readNow(session, meter, customer);
    await this.run(session, session.effects());
    balance ??= await this.readNow(session, meter, customer);
    await this.run(session, session.effects());
    if (balance === null) return;
    // Once handed every message published so far, a copy reads what Redis holds.
    await this.messages(instance, "order");
    const now = (await this.readNow(session, meter, customer)) ?? balance;
    const reducer = `r-${meter.slice(2)}`;
    const local = await this.local(customer, reducer);
    const func = meter === "m-count" ? "count" : meter === "m-tokens" ? "sum" : "max";
    if (session.followed.some((m) => m.loaded && m.held.length === 0 && m.key === stateKey(new Customer("external", customer), reducer))) {
      assert.equal(now.consumed, local.quantity(func), `instance ${instance} reads ${meter} of ${customer} as Redis holds it`);
    }
  }

  /** A read as the driver does it: from memory, or from Redis when the core answers Fetch. */
  async readNow(session: Session, meter: string, customer: string): Promise<Balance | null> {
    const found = session.read(meter, customer);
    if (found === null || found instanceof Balance) return found;
    const fields = new Map<string, Record<string, string>>();
    for (const key of found.keys) fields.set(key, await this.redis.hgetall(key));
    return session.readFetched(meter, customer, null, fields);
  }

  // -- what is checked ------------------------------------------------------------------------

  async local(customer: string, reducer: string): Promise<Aggregate> {
    const fields = await this.redis.hgetall(stateKey(new Customer("external", customer), reducer));
    let total = fields.p === undefined ? EMPTY : (Aggregate.decode(fields.p) as Aggregate);
    for (const [name, text] of Object.entries(fields)) if (name.startsWith("a:")) total = total.merge(Aggregate.decode(text) as Aggregate);
    return total;
  }

  eventual(customer: string, reducer: string): Aggregate {
    let total = EMPTY;
    for (const event of this.stored.values()) {
      if (event.customer !== customer) continue;
      const value = contribution(reducer, event.name, event.tokens);
      if (value !== null) total = total.add(value);
    }
    return total;
  }

  async checkBound(): Promise<void> {
    for (const customer of CUSTOMERS) {
      for (const reducer of REDUCERS) {
        const local = await this.local(customer, reducer);
        const polar = this.eventual(customer, reducer);
        const where = `${customer}/${reducer}: local ${local.encode()} vs Polar's eventual ${polar.encode()}`;
        assert.ok(local.count >= polar.count, where);
        assert.ok(local.sum >= polar.sum - 1e-9, where);
        assert.ok((local.max ?? -Infinity) >= (polar.max ?? -Infinity), where);
      }
    }
  }

  async quiesce(): Promise<void> {
    for (let round = 0; round < 20; round++) {
      await this.deliver(["accept", "accept", "accept"]);
      const backlog = await Promise.all(ALL_OUTBOXES.map((s) => this.redis.xlen(s)));
      if (backlog.every((n) => n === 0) && this.delivery.idle) break;
      this.seconds += 1;
    }
    this.advance(70); // past every bucket and the pending limit of every acknowledgement
    this.sync(floorBucket(this.nowUs));
    for (const customer of CUSTOMERS) {
      this.compute(customer);
      await this.apply(this.snapshots[this.snapshots.length - 1] as PolarSnapshot);
    }
    for (const customer of CUSTOMERS) {
      for (const reducer of REDUCERS) {
        const local = await this.local(customer, reducer);
        const polar = this.eventual(customer, reducer);
        assert.equal(local.encode(), polar.encode(), `${customer}/${reducer} at quiescence`);
        const fields = await this.redis.hgetall(stateKey(new Customer("external", customer), reducer));
        if (fields.n !== undefined) assert.equal(fields.n, "0", `${customer}/${reducer}: nothing pending at quiescence`);
      }
      for (let instance = 0; instance < 2; instance++) {
        for (const meter of ["m-count", "m-tokens", "m-largest"]) await this.read(instance, customer, meter);
      }
    }
    for (const id of this.tracked) assert.ok(this.stored.has(id) || this.dropped.has(id), `event ${id} stored by Polar or reported dropped`);
  }
}

describe("the invariant against a reference model of Polar (fast-check)", () => {
  let server: RedisServer;
  let redis: Redis;
  let subscriber: Redis;
  const published: string[] = [];

  before(async () => {
    server = await RedisServer.start();
    redis = server.client();
    subscriber = server.client();
    subscriber.on("smessage", (channelName: string, message: string) => published.push(channelName === SENTINEL ? SENTINEL : message));
    await subscriber.ssubscribe(...allChannels(), SENTINEL);
  });
  after(async () => server.stop());

  async function execute(program: Step[], texts: Readonly<Record<string, string>> = SCRIPT_TEXT): Promise<void> {
    await redis.flushall();
    published.length = 0;
    const world = new World(redis, published, texts);
    await world.start();
    for (const s of program) {
      switch (s.kind) {
        case "track":
          await world.track(s);
          break;
        case "deliver":
          await world.deliver(s.fates);
          break;
        case "advance":
          world.advance(s.minutes);
          if (s.onTime) world.sync(floorBucket(world.nowUs)); // Polar syncs every closed bucket
          break;
        case "sync":
          world.sync(floorBucket(world.nowUs) - s.lag * BUCKET_US);
          break;
        case "compute":
          world.compute(CUSTOMERS[s.customer] as string);
          break;
        case "apply": {
          const snapshot = world.snapshots[s.which % Math.max(1, world.snapshots.length)];
          if (snapshot !== undefined) await world.apply(snapshot);
          break;
        }
        case "messages":
          await world.messages(s.instance, s.mode);
          break;
        case "read":
          await world.read(s.instance, CUSTOMERS[s.customer] as string, ["m-count", "m-tokens", "m-largest"][s.meter] as string);
          break;
      }
      await world.checkBound();
    }
    await world.quiesce();
  }

  const runs = Number(process.env.OUTPOST_MODEL_EXAMPLES ?? 40);
  const steps = Number(process.env.OUTPOST_MODEL_STEPS ?? 30);
  const seed = Number(process.env.OUTPOST_MODEL_SEED ?? 20261203);

  it("keeps the local aggregate at or above Polar's, and converges", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(step, { maxLength: steps, size: "max" }), (program) => execute(program)),
      { numRuns: runs, seed },
    );
  });

  // The race the invariant guards: tracked into a hot bucket; Polar syncs the bucket and computes a
  // snapshot without the event; the event is delivered and acknowledged while the bucket is still
  // hot locally; the snapshot is applied.
  const ACKNOWLEDGED_WHILE_HOT: Step[] = [
    { kind: "track", customer: 0, name: "api_call", tokens: null, age: 0, again: false },
    { kind: "advance", minutes: 6, onTime: true },
    { kind: "compute", customer: 0 },
    { kind: "deliver", fates: ["accept"] },
    { kind: "apply", which: 0 },
  ];
  const mutant = {
    ...SCRIPT_TEXT,
    acknowledge: composeScript(
      readFileSync(join(REPO, "lua", "lib.lua"), "utf-8"),
      readFileSync(join(CONFORMANCE, "mutants", "acknowledge_hot_forgets.lua"), "utf-8"),
    ),
  };

  it("passes the acknowledged-while-hot case with the real scripts", () =>
    execute(ACKNOWLEDGED_WHILE_HOT));

  it("catches the naive acknowledge rule (the mutant) on the acknowledged-while-hot case", async () => {
    await assert.rejects(execute(ACKNOWLEDGED_WHILE_HOT, mutant), /local .* vs Polar's eventual/);
  });

  it("finds a failing program against the mutant by itself", async () => {
    const details = await fc.check(
      fc.asyncProperty(fc.array(step, { maxLength: steps, size: "max" }), (program) => execute(program, mutant)),
      { numRuns: 500, seed },
    );
    assert.ok(details.failed, "fast-check found no program the mutant fails");
    assert.ok((details.counterexample?.[0]?.length ?? 99) <= 8, `shrunk to ${JSON.stringify(details.counterexample)}`);
  });
});
