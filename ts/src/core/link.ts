/** The WebSocket to Polar: a sans-IO client, JSON frames, keepalive and reconnection
 * (outpost_core/_link.py). The link owns no socket: it says when it wants a connection, turns the
 * driver's bytes into Polar's messages, and queues bytes for the driver to send. Reconnection
 * backs off exponentially with jitter drawn from the injected generator. */

import { UsageError } from "./errors.js";
import { reprString } from "./pyrepr.js";
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
  /** Why Polar refused the upgrade (a bad token), for operators. */
  refused: string | null = null;
  connections = 0;
  peerErrors = 0;
  lastError: string | null = null;
  readonly settings: LinkSettings;

  constructor(
    readonly target: Target,
    private readonly token: string,
    private readonly rng: Random,
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
      this.drop(now, "Polar closed the connection");
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
        this.refused = `Polar refused the WebSocket with HTTP ${event.status}`;
        this.drop(now, this.refused, event.status === 401 || event.status === 403);
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
      const ceiling = Math.min(s.reconnectCap, s.reconnectBase * 2.0 ** (this.failures - 1));
      delay = ceiling * (0.5 + 0.5 * this.rng.random());
    }
    this.retryAt = now + delay;
  }
}

function decode(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return new Unreadable([...text].slice(0, 200).join(""));
  }
}
