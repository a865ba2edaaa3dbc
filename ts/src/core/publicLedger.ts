/** One customer meter in the public-API mode: Polar's figure (the anchor) plus Outpost's own
 * events that the figure does not provably include yet (the ledger). The rules, and why, are in
 * outpost_core/_public_ledger.py and docs/public-mode.md; this is the same machine.
 *
 * An event leaves the ledger only when it was acknowledged before the reading's `modifiedAt`
 * minus the margin AND Polar's consumed rose, beyond the baseline, by at least the total of the
 * events about to leave (max: the reading reaches their largest value; unique: the margin
 * alone). A drop in consumed is a reset. The local balance is the anchor's balance less the
 * ledger, so never above what Polar last reported; for count and sum the consumed it starts from
 * is capped at the last one plus what was dropped since, so a reading that recounts events the
 * ledger still holds does not count them twice. avg and min are relayed, approximate. */

import { UsageError } from "./errors.js";

export const DEFAULT_MARGIN_US = 60_000_000;
const BOUNDED = new Set(["count", "sum", "max", "unique"]);
const RELAYED = new Set(["avg", "min"]);

export interface PolarReading {
  externalCustomerId: string | null;
  customerId: string | null;
  meterId: string;
  consumed: number;
  credited: number;
  balance: number;
  /** null until the row's first update. */
  modifiedAtUs: number | null;
  /** When the meter's current window began, where Polar says so: the current_period_start of
   * the customer's active subscription that carries the meter (a cycle resets its meters). */
  resetAtUs?: number | null;
}

export type Outcome = "first" | "accepted" | "rejected" | "reset" | "stale" | "no_watermark" | "probed" | "probe_rejected" | "probe_unused";

interface Entry {
  value: number;
  key: string | null;
  ackedAtUs: number | null;
}

interface Probe {
  consumed: number;
  sentAtUs: number;
  lagUs: number;
}

/** Events acknowledged before this instant (Outpost's clock) are in the probe's answer. */
const probeWatermark = (probe: Probe): number => probe.sentAtUs - probe.lagUs;

export interface LocalBalance {
  balance: number | null;
  approximate: boolean;
  polarBalance: number | null;
  pending: number;
  anchoredAtUs: number | null;
}

export class MeterLedger {
  anchor: PolarReading | null = null;
  baseline = 0;
  readonly entries = new Map<string, Entry>();
  readonly carried = new Set<string>();
  resetHintUs: number | null = null;
  rejections = 0;
  probe: Probe | null = null;
  /** count and sum: the last basis plus what was dropped since, when that basis came from a
   * reading with a watermark in this window (null otherwise); see carryCap. */
  cap: number | null = null;

  constructor(
    readonly aggregation: string,
    readonly marginUs = DEFAULT_MARGIN_US,
  ) {
    if (!BOUNDED.has(aggregation) && !RELAYED.has(aggregation)) {
      throw new UsageError(`unknown aggregation ${JSON.stringify(aggregation)}`);
    }
    if (marginUs < 0) throw new UsageError("the margin must be >= 0");
  }

  record(eventId: string, value = 1, key: string | null = null): void {
    if (this.aggregation === "unique" && key === null) {
      throw new UsageError("a unique meter's event needs its distinct value as key");
    }
    if (RELAYED.has(this.aggregation) || this.entries.has(eventId)) return;
    this.entries.set(eventId, { value: Math.max(0, value), key, ackedAtUs: null });
  }

  acknowledged(eventIds: Iterable<string>, atUs: number): void {
    for (const id of eventIds) {
      const entry = this.entries.get(id);
      if (entry !== undefined && entry.ackedAtUs === null) entry.ackedAtUs = atUs;
    }
  }

  discard(eventIds: Iterable<string>): void {
    for (const id of eventIds) {
      this.entries.delete(id);
      this.carried.delete(id);
    }
  }

  resetSeen(atUs: number): void {
    this.resetHintUs = atUs;
  }

  observe(reading: PolarReading): Outcome {
    const anchor = this.anchor;
    if (reading.modifiedAtUs === null) {
      if (anchor !== null) return "stale";
      this.learnReset(reading);
      this.anchor = reading;
      return "no_watermark";
    }
    if (anchor !== null && anchor.modifiedAtUs !== null && reading.modifiedAtUs <= anchor.modifiedAtUs) {
      return "stale";
    }
    const before = this.capping();
    this.cap = null;
    this.learnReset(reading);
    this.anchor = reading;
    const watermark = reading.modifiedAtUs - this.marginUs;
    // A reading whose watermark reaches the probe's includes all the probe did.
    if (this.probe !== null && watermark >= probeWatermark(this.probe)) this.probe = null;
    if (anchor !== null && this.isReset(anchor, reading)) {
      this.newWindow(anchor, reading.modifiedAtUs);
      if (!this.check(reading.consumed, watermark)) {
        for (const id of this.covered(watermark)) this.carried.add(id);
      }
      this.baseline = 0;
      return "reset";
    }
    const accepted = this.check(reading.consumed, watermark);
    this.carryCap(before);
    if (accepted) return anchor === null ? "first" : "accepted";
    this.rejections += 1;
    return "rejected";
  }

  /** [the basis, the ledger's total] before a reading or a probe, when the basis bounds what the
   * ledger does not hold: a count or sum meter anchored by a reading with a watermark. */
  private capping(): [number, number] | null {
    const anchor = this.anchor;
    if ((this.aggregation !== "count" && this.aggregation !== "sum") || anchor === null || anchor.modifiedAtUs === null) return null;
    return [this.consumedBasis(), this.total()];
  }

  /** The cap after a reading or a probe: the basis before it plus what it dropped, never below the
   * anchor's consumed less the acknowledged events (the balance stays at or below Polar's), and
   * fixed here, as the state hash holds it. */
  private carryCap(before: [number, number] | null): void {
    const anchor = this.anchor;
    if (before === null || anchor === null) return;
    let acked = 0;
    for (const entry of this.entries.values()) if (entry.ackedAtUs !== null) acked += entry.value;
    this.cap = Math.max(before[0] + (before[1] - this.total()), anchor.consumed - acked);
  }

  private total(): number {
    let total = 0;
    for (const entry of this.entries.values()) total += entry.value;
    return total;
  }

  /** A reading's reset instant is one learnt (resetSeen). */
  private learnReset(reading: PolarReading): void {
    const at = reading.resetAtUs ?? null;
    if (at !== null && (this.resetHintUs === null || at > this.resetHintUs)) this.resetHintUs = at;
  }

  /** Consumed fell, or the reset instant the caller knows lies after the anchor. */
  private isReset(anchor: PolarReading, reading: PolarReading): boolean {
    if (reading.consumed < anchor.consumed) return true;
    const hint = this.resetHintUs;
    return hint !== null && anchor.modifiedAtUs !== null && reading.modifiedAtUs !== null && anchor.modifiedAtUs < hint && hint <= reading.modifiedAtUs;
  }

  private newWindow(lastOld: PolarReading, firstNewUs: number): void {
    const floors: number[] = lastOld.modifiedAtUs === null ? [] : [lastOld.modifiedAtUs];
    if (this.resetHintUs !== null) floors.push(Math.min(this.resetHintUs, firstNewUs));
    this.baseline = 0;
    // (A probe the reading does not cover stays: what it dropped may be of the new window.)
    if (floors.length > 0) {
      const floor = floors.reduce((a, b) => Math.max(a, b));
      for (const id of this.ackedBefore(floor - this.marginUs)) this.entries.delete(id);
    }
    for (const id of [...this.carried]) if (!this.entries.has(id)) this.carried.delete(id);
  }

  private ackedBefore(watermark: number): string[] {
    const found: string[] = [];
    for (const [id, entry] of this.entries) {
      if (entry.ackedAtUs !== null && entry.ackedAtUs < watermark) found.push(id);
    }
    return found;
  }

  private covered(watermark: number): string[] {
    return this.ackedBefore(watermark).filter((id) => !this.carried.has(id));
  }

  private check(consumed: number, watermark: number): boolean {
    const covered = this.covered(watermark);
    const values = covered.map((id) => (this.entries.get(id) as Entry).value);
    const total = values.reduce((a, b) => a + b, 0);
    let ok: boolean;
    if (this.aggregation === "count" || this.aggregation === "sum") ok = consumed - this.baseline >= total;
    else if (this.aggregation === "max") ok = consumed >= values.reduce((a, b) => Math.max(a, b), 0);
    else ok = true; // unique: a value seen before adds nothing, so no sum can be checked
    if (ok) {
      this.baseline += total;
      for (const id of covered) this.entries.delete(id);
    }
    return ok;
  }

  /** A quantities answer for the current window (count and sum meters): Polar's consumed as of
   * `sentAtUs` (Outpost's clock), missing at most what was committed within `lagUs` before. It
   * re-anchors consumed only; the events acknowledged before `sentAtUs - lagUs` leave the ledger
   * when the readings' check passes. Unused: no anchor, another aggregation, not newer than the
   * anchor or the last probe, below the consumed the balance starts from, or above it plus every
   * event the ledger holds (outpost_core/_public_ledger.py says why). */
  observeProbe(consumed: number, sentAtUs: number, lagUs: number): Outcome {
    const anchor = this.anchor;
    const probe: Probe = { consumed, sentAtUs, lagUs };
    const basis = this.figureBasis();
    const held = this.total();
    if (
      anchor === null ||
      (this.aggregation !== "count" && this.aggregation !== "sum") ||
      (anchor.modifiedAtUs !== null && probeWatermark(probe) <= anchor.modifiedAtUs - this.marginUs) ||
      (this.probe !== null && sentAtUs <= this.probe.sentAtUs) ||
      consumed < basis ||
      consumed > basis + held
    ) {
      return "probe_unused";
    }
    const before = this.capping();
    this.probe = probe;
    const checked = this.check(consumed, probeWatermark(probe));
    this.carryCap(before);
    if (checked) return "probed";
    this.rejections += 1;
    return "probe_rejected";
  }

  /** Polar's consumed the balance starts from: the anchor's, or a newer probe's when higher. */
  figureBasis(): number {
    const consumed = this.anchor === null ? 0 : this.anchor.consumed;
    return this.probe === null ? consumed : Math.max(consumed, this.probe.consumed);
  }

  /** The consumed the balance starts from: Polar's, lowered to the cap when one holds. */
  consumedBasis(): number {
    const basis = this.figureBasis();
    return this.cap === null ? basis : Math.min(basis, this.cap);
  }

  balance(): LocalBalance {
    const anchor = this.anchor;
    const approximate = RELAYED.has(this.aggregation);
    if (anchor === null) return { balance: null, approximate, polarBalance: null, pending: 0, anchoredAtUs: null };
    const entries = [...this.entries.values()];
    const basis = this.consumedBasis();
    let pending: number;
    if (approximate) pending = 0;
    else if (this.aggregation === "max") pending = Math.max(0, entries.reduce((a, e) => Math.max(a, e.value), 0) - basis);
    else if (this.aggregation === "unique") pending = new Set(entries.map((e) => e.key)).size;
    else pending = entries.reduce((a, e) => a + e.value, 0);
    pending += basis - anchor.consumed; // (a probe's consumed above the anchor's counts as pending)
    return { balance: anchor.balance - pending, approximate, polarBalance: anchor.balance, pending, anchoredAtUs: anchor.modifiedAtUs };
  }
}
