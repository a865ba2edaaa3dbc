/** The WebSocket to Polar: a sans-IO client, JSON frames, keepalive and reconnection
 * (outpost_core/_link.py). The link owns no socket: it says when it wants a connection, turns the
 * driver's bytes into Polar's messages, and queues bytes for the driver to send. Reconnection
 * backs off exponentially with jitter drawn from the injected generator. */

import { backoff } from "./backoff.js";
import { UsageError } from "./errors.js";
import { jsonOr } from "./json.js";
import { pyJsonDumps, reprString } from "./pyrepr.js";
import type { Random, RandomBytes } from "./random.js";
import { ProtocolError, WebSocketClient, type WsEvent } from "./websocket.js";

export const PATH = "/v1/outpost/";

export enum LinkState {
  DISCONNECTED = "disconnected",
  CONNECTING = "connecting",
  HANDSHAKING = "handshaking",
  OPEN = "open",
  CLOSED = "closed",
}

export class Target {
  constructor(
    readonly host: string,
    readonly port: number,
    readonly tls: boolean,
  ) {}

  /** http(s)://host[:port] → where the WebSocket lives (ws(s), same host). */
  static of(serverUrl: string): Target {
    let url: URL | null = null;
    try {
      url = new URL(serverUrl);
    } catch {
      url = null;
    }
    const scheme = url?.protocol.slice(0, -1) ?? "";
    if (url === null || !["http", "https", "ws", "wss"].includes(scheme) || !url.hostname) {
      throw new UsageError(`server_url must be an http(s) URL, got ${reprString(serverUrl)}`);
    }
    const tls = scheme === "https" || scheme === "wss";
    const host = url.hostname.replace(/^\[(.*)\]$/, "$1");
    return new Target(host, url.port ? Number(url.port) : tls ? 443 : 80, tls);
  }
}

export interface LinkSettings {
  pingInterval: number;
  deadAfter: number;
  connectTimeout: number;
  reconnectBase: number;
  reconnectCap: number;
  refusedDelay: number;
  maxMessage: number;
}

export const DEFAULT_LINK_SETTINGS: LinkSettings = {
  pingInterval: 20,
  deadAfter: 40,
  connectTimeout: 10,
  reconnectBase: 0.25,
  reconnectCap: 30,
  refusedDelay: 60,
  maxMessage: 1 << 20,
};

/** A text frame that is not JSON: kept so the session can count and log it. */
export class Unreadable {
  constructor(readonly excerpt: string) {}
}

const PING = new TextEncoder().encode("outpost");

export class Link {
  state = LinkState.DISCONNECTED;
  retryAt = 0;
  private failures = 0;
  private ws: WebSocketClient | null = null;
  private out: Uint8Array[] = [];
  private lastHeard = 0;
  private lastPing = 0;
  private since = 0;
  /** A refusal whose body is still arriving: its status and the start of its body. */
  private rejection: [number, Uint8Array[], number] | null = null;
  /** Why Polar refused the upgrade (a bad token), for operators. */
  refused: string | null = null;
  /** The HTTP status of the last refused upgrade (404: Polar serves no /v1/outpost/, only its
   * public API). */
  refusedStatus: number | null = null;
  connections = 0;
  peerErrors = 0;
  lastError: string | null = null;
  readonly settings: LinkSettings;

  constructor(
    readonly target: Target,
    private readonly token: string,
    /** The generator the link draws its jitter from (the session shares it). */
    readonly rng: Random,
    private readonly randomBytes: RandomBytes,
    settings: Partial<LinkSettings> = {},
  ) {
    this.settings = { ...DEFAULT_LINK_SETTINGS, ...settings };
  }

  /** Whether the driver should open a connection now; it reports opened() or failed(). */
  wantsConnection(now: number): boolean {
    if (this.state === LinkState.DISCONNECTED && now >= this.retryAt) {
      this.state = LinkState.CONNECTING;
      this.since = now;
      return true;
    }
    return false;
  }

  opened(now: number): void {
    if (this.state === LinkState.CLOSED) return; // closed while the driver was connecting: it drops the connection
    if (this.state !== LinkState.CONNECTING) throw new UsageError(`opened() while ${this.state}`);
    this.ws = new WebSocketClient(this.randomBytes);
    let host = this.target.host;
    if (this.target.port !== (this.target.tls ? 443 : 80)) host = `${host}:${this.target.port}`;
    this.out.push(this.ws.request(host, PATH, [["authorization", `Bearer ${this.token}`]]));
    this.state = LinkState.HANDSHAKING;
    this.since = this.lastHeard = now;
  }

  /** The connection could not be opened, or it broke (EOF, reset, a dead peer). */
  failed(now: number, reason: string): void {
    if (this.state === LinkState.CLOSED) return;
    this.drop(now, reason);
  }

  /** Close for good (the client is closing): a close frame when open. */
  close(): void {
    if (this.state === LinkState.OPEN && this.ws !== null) this.out.push(this.ws.closeFrame(1000));
    this.state = LinkState.CLOSED;
  }

  dataToSend(): Uint8Array {
    const out = Buffer.concat(this.out);
    this.out = [];
    return new Uint8Array(out.buffer, out.byteOffset, out.length);
  }

  /** Feed bytes (empty is EOF); return the JSON messages that arrived, in order. */
  receive(data: Uint8Array, now: number): unknown[] {
    if (this.ws === null || (this.state !== LinkState.HANDSHAKING && this.state !== LinkState.OPEN)) return [];
    this.lastHeard = now;
    if (data.length === 0) {
      if (this.rejection !== null) this.refuse(now); // the body ended with the connection
      else this.drop(now, "Polar closed the connection");
      return [];
    }
    const messages: unknown[] = [];
    const ws = this.ws;
    let events: WsEvent[];
    try {
      events = ws.receive(data);
    } catch (exc) {
      if (!(exc instanceof ProtocolError)) throw exc;
      this.peerErrors += 1;
      this.drop(now, `WebSocket protocol error: ${exc.message}`);
      return messages;
    }
    for (const event of events) {
      this.event(event, now, messages);
      if (this.ws !== ws) break; // the link dropped: the rest belongs to a dead connection
    }
    return messages;
  }

  private partialSize = 0;

  private event(event: WsEvent, now: number, messages: unknown[]): void {
    const ws = this.ws as WebSocketClient;
    switch (event.kind) {
      case "accept":
        this.state = LinkState.OPEN;
        this.failures = 0;
        this.refused = null;
        this.connections += 1;
        this.lastPing = now;
        break;
      case "reject":
        this.rejection = [event.status, [], 0];
        if (!event.hasBody) this.refuse(now);
        break;
      case "rejectData":
        if (this.rejection !== null) {
          const kept = event.data.subarray(0, Math.max(0, DETAIL_LIMIT - this.rejection[2]));
          this.rejection[1].push(kept);
          this.rejection[2] += kept.length;
          if (event.finished) this.refuse(now);
        }
        break;
      case "text": {
        const size = [...event.data].length;
        if (size > this.settings.maxMessage) {
          this.peerErrors += 1;
          this.drop(now, "Polar sent a message over the size limit");
          return;
        }
        messages.push(decode(event.data));
        break;
      }
      case "binary": // the protocol has only text frames
        messages.push(new Unreadable(`binary frame of ${event.size} bytes`));
        break;
      case "ping":
        this.out.push(ws.pong(event.payload));
        break;
      case "close":
        this.out.push(ws.closeFrame(event.code, event.reason));
        this.drop(now, `Polar closed the WebSocket (${event.code})`);
        break;
      case "pong":
        break;
    }
  }

  /** Polar answered the upgrade with an HTTP error (and its body, for the detail). */
  private refuse(now: number): void {
    const [status, body] = this.rejection as [number, Uint8Array[], number];
    this.rejection = null;
    this.refusedStatus = status;
    this.refused = `Polar refused the WebSocket with HTTP ${status}${detail(Buffer.concat(body))}`;
    this.drop(now, this.refused, status === 401 || status === 403);
  }

  /** Queue one message; false when the link is not open (nothing is queued). */
  send(message: Record<string, unknown>): boolean {
    if (this.state !== LinkState.OPEN || this.ws === null) return false;
    this.out.push(this.ws.text(JSON.stringify(message)));
    return true;
  }

  /** Keepalive and timeouts. */
  tick(now: number): void {
    const s = this.settings;
    if (this.state === LinkState.HANDSHAKING && now - this.since > s.connectTimeout) {
      this.drop(now, "Polar did not answer the WebSocket upgrade");
    } else if (this.state === LinkState.OPEN) {
      if (now - this.lastHeard > s.deadAfter) {
        this.drop(now, `no frame from Polar for ${s.deadAfter} s`);
      } else if (now - Math.max(this.lastHeard, this.lastPing) >= s.pingInterval) {
        this.lastPing = now;
        this.out.push((this.ws as WebSocketClient).ping(PING));
      }
    }
  }

  nextDeadline(): number | null {
    const s = this.settings;
    if (this.state === LinkState.DISCONNECTED) return this.retryAt;
    if (this.state === LinkState.HANDSHAKING) return this.since + s.connectTimeout;
    if (this.state === LinkState.OPEN) {
      const ping = Math.max(this.lastHeard, this.lastPing) + s.pingInterval;
      return Math.min(ping, this.lastHeard + s.deadAfter);
    }
    return null;
  }

  private drop(now: number, reason: string, refused = false): void {
    this.lastError = reason;
    this.ws = null;
    this.rejection = null;
    this.partialSize = 0;
    // a close frame answering Polar's still goes out
    if (this.state !== LinkState.OPEN) this.out = [];
    this.state = LinkState.DISCONNECTED;
    this.failures += 1;
    const s = this.settings;
    let delay: number;
    if (refused) {
      delay = s.refusedDelay;
    } else {
      delay = backoff(this.failures, s.reconnectBase, s.reconnectCap, this.rng.random());
    }
    this.retryAt = now + delay;
  }
}

const DETAIL_LIMIT = 500;

/** Polar's reason, from an error body ({"detail": ...} or text), as a suffix. */
function detail(body: Uint8Array): string {
  const text = new TextDecoder().decode(body).trim();
  let parsed = jsonOr(text, text);
  if (typeof parsed === "object" && parsed !== null && !Array.isArray(parsed) && "detail" in parsed) {
    parsed = (parsed as Record<string, unknown>).detail;
  }
  const reason = typeof parsed === "string" ? parsed : pyJsonDumps(parsed);
  return reason ? `: ${[...reason].slice(0, 200).join("")}` : "";
}

function decode(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return new Unreadable([...text].slice(0, 200).join(""));
  }
}
