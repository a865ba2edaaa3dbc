/** What the core noticed that an operator may want to see (telemetry, logs); drained with
 * Session.observations(). Nothing here changes behaviour. */

export type Observation =
  | {
      kind: "SnapshotApplied";
      customer: string;
      snapshotId: string;
      coldUntil: number;
      counted: number;
      meterIds: string[];
      /** Per meter, the consumption this instance read before the snapshot (NaN if not followed). */
      localConsumed: number[];
      /** Per meter, the consumption after it. */
      polarConsumed: number[];
    }
  | { kind: "LinkChanged"; state: "open" | "closed"; reason: string | null; connections: number };
