/** Polar's side of the session: the WebSocket link, configuration, and snapshot flows
 * (outpost_core/_remote.py). */

import { formatNumber, isObject } from "./aggregate.js";
import { type Effect, type RunScript, runScript } from "./effects.js";
import { type Customer, ackedKey, bucketKey, channel, stateKey } from "./keys.js";
import { type Link, LinkState, Unreadable } from "./link.js";
import type { Observation } from "./observations.js";
import { repr, reprString } from "./pyrepr.js";
import { CustomerFlow, MAX_IDS_PER_QUESTION, MalformedSnapshot, type Snapshot, Step, parseSnapshot } from "./snapshots.js";
import { textOf } from "./changes.js";
import { backoff } from "./backoff.js";
import { Deadlines } from "./deadlines.js";
import { Pacer } from "./following.js";
import { byCodePoint } from "./pyrepr.js";
import type { Random } from "./random.js";

export { byCodePoint };

/** Seconds before a snapshot request with no answer is sent again. */
export const REQUEST_TIMEOUT = 5.0;
/** Seconds a snapshot flow may wait in one step (listing, asking, applying) before it gives the
 * snapshot up and asks for a fresh one, whatever lost the answer (Polar, Redis, or a driver). */
export const STEP_TIMEOUT = 10.0;
/** The backoff of a flow that failed (Redis could not list or apply): from RETRY_BASE seconds,
 * doubling up to RETRY_CAP, with jitter. */
export const RETRY_BASE = 0.25;
export const RETRY_CAP = 10.0;

/** What the remote side needs of the session. */
export interface Host {
  emit(effect: Effect): void;
  configure(payload: unknown): void;
  knownRev(stateKey: string): number;
  reject(kind: string, detail: string): void;
  observe(observation: Observation): void;
  consumed(customer: Customer, reducerId: string): Map<string, number>;
  aliasesChanged(customer: Customer, aliases: readonly Customer[]): void;
  /** The customers read within the session's recentWindow, most recent first. */
  recentlyRead(): Customer[];
  /** The customer's events no snapshot counted yet: [delivered to Polar, not yet delivered]. */
  unsettled(customer: Customer): [number, number];
  readonly refreshAfter: number | null;
  readonly reloadRate: number;
  readonly pendingLimitUs: number;
  readonly channelNamespace: string;
  /** The deployment's shard count. */
  readonly shards: number;
  shardOf(customer: Customer): number;
}

/** Polar's side of a session: the link, and one snapshot flow per customer followed. Every wait
 * of a flow has a deadline checked on tick(): an unanswered snapshot request is sent again after
 * REQUEST_TIMEOUT, a step that waits longer than STEP_TIMEOUT gives its snapshot up and asks
 * again, and a flow whose Redis work failed asks again after a backoff. */
export class Remote {
  readonly flows = new Map<string, CustomerFlow>();
  /** Per customer (by tag), its other reference forms from its latest snapshot (kept across
   * reconnects: they name the same customer). */
  readonly aliases = new Map<string, readonly Customer[]>();
  private readonly tags = new Map<number, CustomerFlow>();
  private readonly questions = new Map<string, CustomerFlow>();
  private ids = 1;
  /** Each flow's next deadline (see flowDeadline): a tick costs what is due. */
  private readonly deadlines = new Deadlines<string>();
  /** Customers read recently to ask again after a reconnect, at the pace below. */
  private asks: Customer[] = [];
  private readonly pace: Pacer;
  wallUs = 0;
  now = 0;
  snapshotsApplied = 0;
  snapshotsReceived = 0;

  constructor(
    private readonly host: Host,
    readonly link: Link,
    private readonly rng: Random,
  ) {
    this.pace = new Pacer(host.reloadRate);
  }

  private nextId(): number {
    return this.ids++;
  }

  // -- link plumbing --------------------------------------------------------------------------

  tick(now: number): void {
    this.now = now;
    const before = this.link.state;
    this.link.tick(now);
    this.afterLink(before);
    if (this.link.wantsConnection(now)) {
      const t = this.link.target;
      const timeout = this.link.settings.connectTimeout;
      this.host.emit({ kind: "OpenConnection", host: t.host, port: t.port, tls: t.tls, timeout });
    }
    for (const tag of this.deadlines.popDue(now)) {
      const flow = this.flows.get(tag) as CustomerFlow; // (letting a customer go cancels it)
      this.due(flow, now);
      this.schedule(flow);
    }
    if (this.asks.length) this.askPaced();
    this.flush();
  }

  private due(flow: CustomerFlow, now: number): void {
    const due = flowDeadline(flow);
    if (due === null || due > now) return; // (every change of a flow reschedules it: defensive)
    if (flow.step !== Step.IDLE) {
      this.host.reject("stuck_flow", `${flow.customer}: no answer while ${flow.step}`);
      this.restart(flow);
    } else if (flow.retryAt !== null) {
      flow.retryAt = null;
      this.request(flow);
    } else if (!flow.applied && flow.requestId !== null) {
      this.request(flow); // unanswered
    } else {
      this.refresh(flow);
    }
  }

  /** No snapshot for a while: ask for one if Polar has delivered events this instance still
   * counts as pending; wait again while some are still on their way to Polar. */
  private refresh(flow: CustomerFlow): void {
    flow.refreshAt = null;
    if (flow.dormant) return; // not asked since a reconnect: its next read asks
    const [delivered, undelivered] = this.host.unsettled(flow.customer);
    if (delivered) this.request(flow);
    if (delivered || undelivered) this.armRefresh(flow);
  }

  private armRefresh(flow: CustomerFlow): void {
    const after = this.host.refreshAfter;
    flow.refreshAt = after === null ? null : this.now + after;
  }

  private schedule(flow: CustomerFlow): void {
    this.deadlines.set(flow.customer.tag, flowDeadline(flow));
  }

  /** Move `flow` on to `step`, which waits (its deadline counted from now) for the answer to an
   * effect: returns the tag that effect carries. */
  private awaitAnswer(flow: CustomerFlow, step: Step): number {
    const tag = this.nextId();
    this.tags.set(tag, flow);
    flow.step = step;
    flow.since = this.now;
    flow.tag = tag;
    this.schedule(flow);
    return tag;
  }

  /** The earliest time tick() has work: the link's, a flow's, or the next paced request's. */
  nextDeadline(): number | null {
    const deadlines: number[] = [];
    const link = this.link.nextDeadline();
    if (link !== null) deadlines.push(link);
    const flow = this.deadlines.next();
    if (flow !== null) deadlines.push(flow);
    if (this.asks.length) deadlines.push(this.pace.nextAt(this.now));
    return deadlines.length ? Math.min(...deadlines) : null;
  }

  close(): void {
    this.link.close();
    this.flush();
  }

  opened(now: number): void {
    this.now = now;
    this.link.opened(now);
    this.flush();
  }

  failed(now: number, reason: string): void {
    const wasOpen = this.link.state === LinkState.OPEN;
    this.link.failed(now, reason);
    this.abandon();
    if (wasOpen) this.host.observe({ kind: "LinkChanged", state: "closed", reason, connections: this.link.connections });
  }

  received(data: Uint8Array, now: number): void {
    this.now = now;
    let before = this.link.state;
    const connections = this.link.connections;
    const messages = this.link.receive(data, now);
    if (this.link.connections > connections) {
      // the upgrade was accepted in these bytes
      this.onOpen();
      before = LinkState.OPEN;
    }
    for (const message of messages) this.message(message);
    this.afterLink(before);
  }

  /** After the link ran: send what it queued; when it dropped its connection, have the driver
   * close the socket and forget what was in flight on it. */
  private afterLink(before: LinkState): void {
    this.flush();
    const dropped = this.link.state === LinkState.DISCONNECTED;
    if (dropped && (before === LinkState.HANDSHAKING || before === LinkState.OPEN)) {
      this.host.emit({ kind: "CloseConnection" });
      this.abandon();
      if (before === LinkState.OPEN) {
        this.host.observe({ kind: "LinkChanged", state: "closed", reason: this.link.lastError, connections: this.link.connections });
      }
    }
  }

  private flush(): void {
    const data = this.link.dataToSend();
    if (data.length) this.host.emit({ kind: "SendBytes", data });
  }

  private onOpen(): void {
    this.host.observe({ kind: "LinkChanged", state: "open", reason: null, connections: this.link.connections });
    this.link.send({ type: "configuration" });
    // Ask at once for the snapshots reads wait for; those of customers read recently at the
    // reload pace, most recent first; the others when they are next read.
    for (const flow of this.flows.values()) {
      flow.reset();
      if (flow.applied) flow.dormant = true;
      else this.request(flow);
    }
    this.asks = this.host.recentlyRead().reverse(); // (popped from the end)
    this.askPaced();
  }

  private askPaced(): void {
    let granted = this.pace.take(this.now, this.asks.length);
    while (granted > 0 && this.asks.length) {
      const flow = this.flows.get((this.asks.pop() as Customer).tag);
      if (flow !== undefined && flow.dormant) {
        this.wake(flow);
        granted -= 1;
      }
    }
  }

  private wake(flow: CustomerFlow): void {
    flow.dormant = false;
    this.request(flow);
    this.flush();
  }

  private abandon(): void {
    for (const flow of [...this.flows.values()]) {
      flow.reset();
      if (flow.pushed) this.letGo(flow);
      else this.schedule(flow);
    }
    this.tags.clear();
    this.questions.clear();
    this.asks = [];
  }

  // -- customers ------------------------------------------------------------------------------

  follow(customer: Customer): CustomerFlow {
    let flow = this.flows.get(customer.tag);
    if (flow === undefined) {
      flow = new CustomerFlow(customer);
      this.flows.set(customer.tag, flow);
      this.request(flow);
      this.flush();
    } else if (flow.pushed) {
      // Followed now: Polar pushes its snapshots only once asked.
      flow.pushed = false;
      this.request(flow);
      this.flush();
    } else if (flow.dormant) {
      this.wake(flow); // read: ask now, whatever the pace
    }
    return flow;
  }

  /** The session let the customer go: drop its flow (what is in flight is ignored when it
   * answers), tell Polar to stop pushing its snapshots; return its aliases. */
  forget(customer: Customer): readonly Customer[] {
    this.abandonFlow(this.flows.get(customer.tag) as CustomerFlow); // (every one followed has one)
    this.flows.delete(customer.tag);
    this.deadlines.cancel(customer.tag);
    this.link.send({ type: "forget", payload: customer.wire() }); // dropped unless open
    this.flush();
    const aliases = this.aliases.get(customer.tag) ?? [];
    this.aliases.delete(customer.tag);
    return aliases;
  }

  /** The customer's state in Redis has no snapshot although this instance applied one (its keys
   * expired, or Redis was wiped): ask Polar for one again, at most once per REQUEST_TIMEOUT. */
  lost(customer: Customer): void {
    const flow = this.follow(customer);
    const recent = flow.requestedAt > 0 && this.now - flow.requestedAt < REQUEST_TIMEOUT;
    if (flow.applied && flow.step === Step.IDLE && !recent) {
      flow.applied = false;
      this.request(flow);
      this.flush();
    }
  }

  private request(flow: CustomerFlow): void {
    const requestId = `s${this.nextId()}`;
    const payload = { request_id: requestId, ...flow.customer.wire() };
    if (this.link.send({ type: "snapshot", payload })) {
      flow.requestId = requestId;
      flow.requestedAt = this.now;
      this.schedule(flow);
    }
  }

  // -- messages -------------------------------------------------------------------------------

  private message(message: unknown): void {
    if (message instanceof Unreadable) {
      this.host.reject("frame", `text frame that is not JSON: ${reprString(message.excerpt)}`);
      return;
    }
    if (!isObject(message) || typeof message.type !== "string") {
      this.host.reject("frame", "frame without a type");
      return;
    }
    const payload = message.payload;
    switch (message.type) {
      case "configuration":
        this.host.configure(payload);
        break;
      case "snapshot":
        this.snapshot(payload);
        break;
      case "counted":
        this.counted(payload);
        break;
      case "error":
        this.error(payload);
        break;
      default:
        this.host.reject("frame", `unknown message type ${reprString(message.type)}`);
    }
  }

  private snapshot(payload: unknown): void {
    let snapshot: Snapshot;
    try {
      snapshot = parseSnapshot(payload);
    } catch (exc) {
      if (!(exc instanceof MalformedSnapshot)) throw exc;
      this.host.reject("snapshot", exc.message);
      return;
    }
    this.snapshotsReceived += 1;
    let flow = this.flows.get(snapshot.customer.tag);
    if (flow === undefined) {
      // Unasked-for (Polar pushes only what was asked; one may still be on its way after a
      // `forget`): apply it, never ask for more, and keep nothing once it is done.
      flow = new CustomerFlow(snapshot.customer, true);
      flow.pushed = true;
      this.flows.set(snapshot.customer.tag, flow);
    }
    if (!sameCustomers(this.aliases.get(snapshot.customer.tag) ?? [], snapshot.aliases)) {
      this.aliases.set(snapshot.customer.tag, snapshot.aliases);
      this.host.aliasesChanged(snapshot.customer, snapshot.aliases);
    }
    if (snapshot.requestId !== null && snapshot.requestId === flow.requestId) flow.requestId = null;
    if (flow.offer(snapshot)) this.start(flow);
  }

  /** List the fields of the customer's state hashes: their `a:` fields are the buckets that hold
   * pending events (conformance/README.md §1). */
  private start(flow: CustomerFlow): void {
    const current = flow.current as Snapshot;
    flow.retryAt = null;
    const tag = this.awaitAnswer(flow, Step.BUCKETS);
    const keys = [...current.reducers.keys()].map((reducerId) => stateKey(flow.customer, reducerId, this.host.shards));
    this.host.emit({ kind: "ListPending", tag, keys });
  }

  listed(tag: number, fields: Map<string, unknown[]> | Record<string, unknown[]>): void {
    const flow = this.tags.get(tag);
    this.tags.delete(tag);
    if (flow === undefined || flow.current === null) return;
    if (flow.step !== Step.BUCKETS && flow.step !== Step.LISTING) return;
    const entries = fields instanceof Map ? [...fields.entries()] : Object.entries(fields);
    if (flow.step === Step.BUCKETS) this.listEvents(flow, entries);
    else this.listedEvents(flow, entries);
  }

  /** List the events of the buckets before the snapshot's cold_until only: the hot buckets' events
   * are none of its business, however many they are. */
  private listEvents(flow: CustomerFlow, entries: [string, unknown[]][]): void {
    const coldUntil = (flow.current as Snapshot).coldUntil;
    const keys: string[] = [];
    for (const [state, names] of entries) {
      for (const raw of names) {
        const name = raw instanceof Uint8Array ? (textOf(raw) ?? "") : String(raw);
        const bucket = name.startsWith("a:") ? name.slice(2) : "";
        if (/^[0-9]+$/.test(bucket) && Number(bucket) < coldUntil) keys.push(bucketKey(state, bucket));
      }
    }
    if (keys.length === 0) {
      this.apply(flow);
      return;
    }
    const tag = this.awaitAnswer(flow, Step.LISTING);
    this.host.emit({ kind: "ListPending", tag, keys: keys.sort(byCodePoint) });
  }

  private listedEvents(flow: CustomerFlow, entries: [string, unknown[]][]): void {
    const current = flow.current as Snapshot;
    const coldUntil = current.coldUntil;
    for (const [key, names] of entries) {
      const cut = key.lastIndexOf(":ev:");
      const state = cut < 0 ? "" : key.slice(0, cut);
      for (const raw of names) {
        const name = raw instanceof Uint8Array ? textOf(raw) : String(raw);
        if (name === null) {
          this.host.reject("state", `${key}: field that is not UTF-8 text: ${repr(raw)}`);
          continue;
        }
        const colon = name.indexOf(":");
        const bucket = colon < 0 ? name : name.slice(0, colon);
        const eventId = colon < 0 ? "" : name.slice(colon + 1);
        if (!/^[0-9]+$/.test(bucket) || !eventId) {
          this.host.reject("state", `${key}: unreadable field ${reprString(name)}`);
          continue;
        }
        if (Number(bucket) < coldUntil) {
          const list = flow.candidates.get(eventId) ?? [];
          list.push(`${state}\n${name}`);
          flow.candidates.set(eventId, list);
        }
      }
    }
    if (flow.candidates.size === 0) {
      this.apply(flow);
      return;
    }
    flow.step = Step.ASKING;
    flow.since = this.now;
    flow.tag = null;
    this.schedule(flow);
    const ids = [...flow.candidates.keys()].sort(byCodePoint);
    for (let start = 0; start < ids.length; start += MAX_IDS_PER_QUESTION) {
      const requestId = `q${this.nextId()}`;
      const payload = {
        request_id: requestId,
        snapshot_id: current.snapshotId,
        event_ids: ids.slice(start, start + MAX_IDS_PER_QUESTION),
      };
      if (!this.link.send({ type: "counted", payload })) {
        this.restart(flow);
        return;
      }
      flow.questions.add(requestId);
      this.questions.set(requestId, flow);
    }
    this.flush();
  }

  listFailed(tag: number): void {
    const flow = this.tags.get(tag);
    this.tags.delete(tag);
    if (flow !== undefined) this.fail(flow);
  }

  private counted(payload: unknown): void {
    const requestId = isObject(payload) ? payload.request_id : undefined;
    let flow: CustomerFlow | undefined;
    if (typeof requestId === "string") {
      flow = this.questions.get(requestId);
      this.questions.delete(requestId);
    }
    if (flow === undefined || !isObject(payload)) {
      this.host.reject("counted", `answer to no question: ${repr(requestId)}`);
      return;
    }
    const ids = payload.event_ids;
    if (!Array.isArray(ids)) {
      this.host.reject("counted", "event_ids is not a list");
      this.restart(flow);
      return;
    }
    flow.questions.delete(requestId as string);
    for (const id of ids) if (typeof id === "string" && flow.candidates.has(id)) flow.counted.add(id);
    if (flow.questions.size === 0 && flow.step === Step.ASKING) this.apply(flow);
  }

  private error(payload: unknown): void {
    if (!isObject(payload)) {
      this.host.reject("error", "error frame without a payload");
      return;
    }
    const { request_id: requestId, code } = payload;
    let flow: CustomerFlow | undefined;
    if (typeof requestId === "string") {
      flow = this.questions.get(requestId);
      this.questions.delete(requestId);
    }
    if (flow !== undefined && code === "snapshot_expired") {
      this.restart(flow);
      return;
    }
    this.host.reject("error", `Polar answered ${repr(code)}: ${repr(payload.message)}`);
    if (flow !== undefined) this.restart(flow);
  }

  /** Give up the snapshot in progress and ask for a fresh one. */
  private restart(flow: CustomerFlow): void {
    this.abandonFlow(flow);
    if (flow.pushed) {
      this.letGo(flow); // nobody asked for it: asking Polar now would follow it
      return;
    }
    this.request(flow);
    this.flush();
  }

  /** Redis could not do the flow's work: give the snapshot up and ask for a fresh one after a
   * backoff (asking at once would loop as fast as Polar answers while Redis is down). */
  private fail(flow: CustomerFlow): void {
    this.abandonFlow(flow);
    if (flow.pushed) {
      this.letGo(flow); // nobody asked for it: no retry, which would ask Polar
      return;
    }
    flow.failures += 1;
    flow.retryAt = this.now + backoff(flow.failures, RETRY_BASE, RETRY_CAP, this.rng.random());
    this.schedule(flow);
  }

  private abandonFlow(flow: CustomerFlow): void {
    for (const requestId of flow.questions) this.questions.delete(requestId);
    if (flow.tag !== null) this.tags.delete(flow.tag); // a late answer to it is ignored
    flow.reset();
    this.schedule(flow);
  }

  // -- applying -------------------------------------------------------------------------------

  private apply(flow: CustomerFlow): void {
    const snapshot = flow.current as Snapshot;
    flow.before = new Map([...snapshot.reducers.keys()].map((r) => [r, this.host.consumed(flow.customer, r)]));
    const tag = this.awaitAnswer(flow, Step.APPLYING);
    const counted = new Map<string, string[]>();
    for (const eventId of [...flow.counted].sort(byCodePoint)) {
      for (const pair of flow.candidates.get(eventId) ?? []) {
        const cut = pair.indexOf("\n");
        const key = pair.slice(0, cut);
        const list = counted.get(key) ?? [];
        list.push(pair.slice(cut + 1));
        counted.set(key, list);
      }
    }
    this.host.emit(applyScript(snapshot, counted, this.host, this.wallUs, tag));
  }

  applied(tag: number): void {
    const flow = this.tags.get(tag);
    this.tags.delete(tag);
    if (flow === undefined || flow.step !== Step.APPLYING) return;
    flow.applied = true;
    this.snapshotsApplied += 1;
    const snapshot = flow.current as Snapshot;
    const meters: string[] = [];
    const before: number[] = [];
    const after: number[] = [];
    for (const [reducerId, old] of flow.before) {
      for (const [meterId, value] of this.host.consumed(flow.customer, reducerId)) {
        meters.push(meterId);
        before.push(old.get(meterId) ?? Number.NaN);
        after.push(value);
      }
    }
    this.host.observe({
      kind: "SnapshotApplied",
      customer: flow.customer.tag,
      snapshotId: snapshot.snapshotId,
      coldUntil: snapshot.coldUntil,
      counted: flow.counted.size,
      meterIds: meters,
      localConsumed: before,
      polarConsumed: after,
    });
    if (flow.finish() !== null) this.start(flow);
    else if (flow.pushed) this.letGo(flow);
    else {
      this.armRefresh(flow);
      this.schedule(flow);
    }
  }

  /** A flow nobody follows is done: keep nothing of it (its customer's aliases included). */
  private letGo(flow: CustomerFlow): void {
    this.flows.delete(flow.customer.tag);
    this.deadlines.cancel(flow.customer.tag);
    this.aliases.delete(flow.customer.tag);
  }

  applyFailed(tag: number): void {
    const flow = this.tags.get(tag);
    this.tags.delete(tag);
    if (flow !== undefined) this.fail(flow);
  }
}

function sameCustomers(a: readonly Customer[], b: readonly Customer[]): boolean {
  return a.length === b.length && a.every((c, i) => c.tag === (b[i] as Customer).tag);
}

/** When a flow is due: its step gives up, its retry comes, its request is sent again, or it
 * looks whether it should ask for a fresher snapshot. */
function flowDeadline(flow: CustomerFlow): number | null {
  if (flow.step !== Step.IDLE) return flow.since + STEP_TIMEOUT;
  if (flow.retryAt !== null) return flow.retryAt;
  if (!flow.applied && flow.requestId !== null) return flow.requestedAt + REQUEST_TIMEOUT;
  return flow.refreshAt;
}

function applyScript(snapshot: Snapshot, counted: Map<string, string[]>, host: Host, wallUs: number, tag: number): RunScript {
  const customer = snapshot.customer;
  const keys: string[] = [];
  const args = [
    channel(host.shardOf(customer), host.channelNamespace),
    String(wallUs),
    String(host.pendingLimitUs),
    String(snapshot.coldUntil),
    String(snapshot.asOf),
    snapshot.snapshotId,
    String(snapshot.credited.size),
  ];
  for (const [meterId, units] of snapshot.credited) args.push(meterId, formatNumber(units));
  for (const [reducerId, aggregate] of snapshot.reducers) {
    const state = stateKey(customer, reducerId, host.shards);
    const names = counted.get(state) ?? [];
    keys.push(state, ackedKey(state));
    args.push(String(host.knownRev(state)), aggregate.encode(), String(names.length), ...names);
  }
  return runScript("apply_snapshot", keys, args, tag);
}
