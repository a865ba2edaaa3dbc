/** What the core asks its driver to do (outpost_core/_effects.py, fields in camelCase). The driver
 * executes each and reports the outcome back as an input. */

export interface RunScript {
  kind: "RunScript";
  /** One of the scripts of lua/, by name, run with EVALSHA. */
  script: string;
  keys: string[];
  args: string[];
  /** Echoed in ScriptReplied / ScriptFailed when the core needs to know. */
  tag: number | null;
  /** The meters the write counts in (telemetry names them). */
  meterIds: string[];
  /** The buckets the write reduces into, one per identity (telemetry counts them). */
  buckets: number;
}

/** What Session.read answers when the balance must come from Redis: HGETALL of each key now (one
 * round trip), then Session.readFetched with the fields per key (not an effect: the caller runs
 * it). The first key is the customer's own state; the others are its aliases'. */
export interface Fetch {
  kind: "Fetch";
  keys: string[];
}

export type Effect =
  | RunScript
  /** HGETALL key; report IdentityLoaded or LoadFailed with the same loadId (a reply to an older
   * load of the key is ignored: it may have read the hash before changes the copy already has). */
  | { kind: "LoadIdentity"; key: string; loadId: number }
  /** SET the configuration cache key to text (Polar's configuration payload, JSON). */
  | { kind: "StoreConfiguration"; key: string; text: string }
  /** HKEYS each events hash; report PendingListed (or ListFailed). */
  | { kind: "ListPending"; tag: number; keys: string[] }
  /** Open a TCP connection (TLS when tls) to Polar's WebSocket host, giving up after timeout
   * seconds; report ConnectionOpened or ConnectionFailed. */
  | { kind: "OpenConnection"; host: string; port: number; tls: boolean; timeout: number }
  /** Write data to the WebSocket connection (drop it if there is none any more). */
  | { kind: "SendBytes"; data: Uint8Array }
  /** Close the WebSocket connection's socket; no report is needed. */
  | { kind: "CloseConnection" };

export function runScript(
  script: string,
  keys: string[],
  args: string[],
  tag: number | null = null,
  meterIds: string[] = [],
  buckets = 0,
): RunScript {
  return { kind: "RunScript", script, keys, args, tag, meterIds, buckets };
}
