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
}

export type Effect =
  | RunScript
  /** HGETALL key; report IdentityLoaded or LoadFailed. */
  | { kind: "LoadIdentity"; key: string }
  /** SET the configuration cache key to text (Polar's configuration payload, JSON). */
  | { kind: "StoreConfiguration"; key: string; text: string }
  /** HKEYS each events hash; report PendingListed (or ListFailed). */
  | { kind: "ListPending"; tag: number; keys: string[] }
  /** Open a TCP connection (TLS when tls) to Polar's WebSocket host; report ConnectionOpened or
   * ConnectionFailed. */
  | { kind: "OpenConnection"; host: string; port: number; tls: boolean }
  /** Write data to the WebSocket connection (drop it if there is none any more). */
  | { kind: "SendBytes"; data: Uint8Array }
  /** Close the WebSocket connection's socket; no report is needed. */
  | { kind: "CloseConnection" };

export function runScript(script: string, keys: string[], args: string[], tag: number | null = null, meterIds: string[] = []): RunScript {
  return { kind: "RunScript", script, keys, args, tag, meterIds };
}
