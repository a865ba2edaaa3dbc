/** Which node of a Redis Cluster holds the subscription to each shard channel
 * (outpost_core/_placement.py, the same behaviour, names in camelCase).
 *
 * A sharded subscription lives on the node that owns the channel's slot, and no client follows a
 * fail-over or a slot migration by itself. The driver reads the slot map (after a break, and
 * every so often) and tells this machine who owns what; the machine answers with the
 * subscriptions to make and drop on each node, and with what the session must hear: a channel
 * stops counting as followed as soon as its node breaks or gives the slot away (ChannelsLost),
 * and counts again once its owner confirmed it (ChannelSubscribed). A confirmation that comes
 * from a node that no longer holds the channel (it moved meanwhile) changes nothing.
 *
 * Sans-IO like the session: the driver feeds handle() and runs what effects() gives, in order. */

import { UsageError } from "./errors.js";
import { byCodePoint, repr } from "./pyrepr.js";

// -- what the driver saw ------------------------------------------------------------------------

/** The slot map as the cluster client sees it now: each channel's owning node by name
 * (`host:port`), or null where no node serves its slot yet. */
export interface SlotMapRead {
  kind: "SlotMapRead";
  owners: ReadonlyMap<string, string | null> | Readonly<Record<string, string | null>>;
}

/** `node` confirmed its subscription to `channel`. */
export interface NodeConfirmed {
  kind: "NodeConfirmed";
  node: string;
  channel: string;
}

/** `node` stopped serving these channels while its connection lives on: it refused a
 * subscription, or told of a slot that moved away. null (or left out): every channel it held (a
 * client that says a slot moved without saying which). */
export interface NodeGaveUp {
  kind: "NodeGaveUp";
  node: string;
  channels?: readonly string[] | null;
}

/** The subscription connection to `node` broke; the driver has dropped it. */
export interface NodeBroke {
  kind: "NodeBroke";
  node: string;
}

export type PlacementInput = SlotMapRead | NodeConfirmed | NodeGaveUp | NodeBroke;

// -- what the driver does -----------------------------------------------------------------------

/** Subscribe `channel` on `node` (one slot per command), opening a subscription connection to the
 * node if there is none. */
export interface SubscribeOnNode {
  kind: "SubscribeOnNode";
  node: string;
  channel: string;
}

/** The slots of `channels` moved away from `node`: unsubscribe them there (a fail-over no call saw
 * fail). */
export interface UnsubscribeOnNode {
  kind: "UnsubscribeOnNode";
  node: string;
  channels: string[];
}

/** `node` holds no channel any more: close its subscription connection. */
export interface RetireNode {
  kind: "RetireNode";
  node: string;
}

/** The session's inputs of the same names (inputs.ts), with the channels as text. */
export type PlacementEffect =
  | SubscribeOnNode
  | UnsubscribeOnNode
  | RetireNode
  | { kind: "ChannelsLost"; channels: string[] }
  | { kind: "ChannelSubscribed"; channel: string };

export class ChannelPlacement {
  readonly channels: readonly string[];
  /** node -> the channels given to it; a node left with none stays until the next slot map. */
  private readonly held = new Map<string, Set<string>>();
  private pending: PlacementEffect[] = [];

  constructor(channels: Iterable<string>) {
    this.channels = [...channels];
  }

  handle(event: PlacementInput): void {
    switch ((event as { kind?: unknown } | null)?.kind) {
      case "SlotMapRead":
        this.place((event as SlotMapRead).owners);
        break;
      case "NodeConfirmed": {
        const { node, channel } = event as NodeConfirmed;
        if (this.heldBy(node, channel)) this.pending.push({ kind: "ChannelSubscribed", channel });
        break;
      }
      case "NodeGaveUp": {
        const { node, channels } = event as NodeGaveUp;
        const held = this.held.get(node);
        if (held === undefined) break;
        const gone = new Set(channels === null || channels === undefined ? held : channels.filter((channel) => held.has(channel)));
        for (const channel of gone) held.delete(channel);
        this.lose(gone);
        break;
      }
      case "NodeBroke": {
        const { node } = event as NodeBroke;
        const held = this.held.get(node);
        this.held.delete(node);
        this.lose(held ?? []);
        break;
      }
      default:
        throw new UsageError(`not an input of the channel placement: ${repr(event)}`);
    }
  }

  /** What to do, in order; each call hands out what came since the last. */
  effects(): PlacementEffect[] {
    const effects = this.pending;
    this.pending = [];
    return effects;
  }

  /** Whether a channel has no node (its slot unserved, its node broke or refused it): the driver
   * then looks at the slot map again soon. */
  unplaced(): boolean {
    let placed = 0;
    for (const held of this.held.values()) placed += held.size;
    return placed < this.channels.length;
  }

  /** Whether `channel` is given to `node` now. */
  heldBy(node: string, channel: string): boolean {
    return this.held.get(node)?.has(channel) ?? false;
  }

  private place(given: SlotMapRead["owners"]): void {
    const owners = ownersOf(given);
    const missing = this.channels.filter((channel) => !owners.has(channel));
    if (missing.length) throw new UsageError(`the slot map read names no owner for ${repr(missing)}`);
    for (const [node, held] of this.held) {
      const moved = [...held].filter((channel) => owners.get(channel) !== node);
      if (moved.length) {
        for (const channel of moved) held.delete(channel);
        this.pending.push({ kind: "UnsubscribeOnNode", node, channels: sorted(moved) });
        this.lose(moved);
      }
    }
    const placed = new Set<string>();
    for (const held of this.held.values()) for (const channel of held) placed.add(channel);
    for (const channel of this.channels) {
      const owner = owners.get(channel) ?? null;
      if (placed.has(channel) || owner === null) continue; // an unserved slot is looked at again
      let held = this.held.get(owner);
      if (held === undefined) this.held.set(owner, (held = new Set()));
      held.add(channel);
      this.pending.push({ kind: "SubscribeOnNode", node: owner, channel });
    }
    for (const [node, held] of [...this.held]) {
      if (held.size) continue;
      this.held.delete(node); // every slot it served went elsewhere
      this.pending.push({ kind: "RetireNode", node });
    }
  }

  private lose(channels: Iterable<string>): void {
    const lost = sorted(channels);
    if (lost.length) this.pending.push({ kind: "ChannelsLost", channels: lost });
  }
}

function ownersOf(owners: SlotMapRead["owners"]): ReadonlyMap<string, string | null> {
  if (owners instanceof Map) return owners;
  return new Map(Object.entries(owners as Record<string, string | null>));
}

/** In code point order, as Python's sorted() orders text. */
function sorted(channels: Iterable<string>): string[] {
  return [...channels].sort(byCodePoint);
}
