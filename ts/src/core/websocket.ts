/** A sans-IO WebSocket client (RFC 6455), the part of wsproto the link needs: the upgrade request,
 * the server's answer, frames in both directions. No socket, no clock; the handshake key and the
 * masks come from the injected byte source. */

import { createHash } from "node:crypto";
import type { RandomBytes } from "./random.js";

export const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const ASCII = new TextEncoder();
const UTF8 = new TextDecoder("utf-8", { fatal: true });

export enum Opcode {
  CONTINUATION = 0,
  TEXT = 1,
  BINARY = 2,
  CLOSE = 8,
  PING = 9,
  PONG = 10,
}

export type WsEvent =
  | { kind: "accept" }
  /** The upgrade was refused with an HTTP error; hasBody: rejectData events follow. */
  | { kind: "reject"; status: number; hasBody: boolean }
  /** Bytes of a refusal's body; finished once it is complete (by Content-Length). */
  | { kind: "rejectData"; data: Uint8Array; finished: boolean }
  | { kind: "text"; data: string }
  | { kind: "binary"; size: number }
  | { kind: "ping"; payload: Uint8Array }
  | { kind: "pong" }
  | { kind: "close"; code: number; reason: string };

/** The peer broke the protocol. */
export class ProtocolError extends Error {}

export function acceptFor(key: string): string {
  return createHash("sha1").update(key + GUID).digest("base64");
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

// wsproto's rule: a known reason a peer may send, or a library or private code (3000-4999).
const KNOWN_CLOSE = [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013];
const VALID_CLOSE = (code: number): boolean => KNOWN_CLOSE.includes(code) || (code >= 3000 && code <= 4999);

export class WebSocketClient {
  private buffer: Uint8Array = new Uint8Array(0);
  private handshaken = false;
  private key = "";
  private fragments: Uint8Array[] | null = null;
  private fragmentOpcode = Opcode.TEXT;
  private closed = false;

  constructor(private readonly randomBytes: RandomBytes) {}

  /** The upgrade request. */
  request(host: string, target: string, headers: [string, string][]): Uint8Array {
    this.key = Buffer.from(this.randomBytes(16)).toString("base64");
    const lines = [
      `GET ${target} HTTP/1.1`,
      `host: ${host}`,
      "upgrade: websocket",
      "connection: Upgrade",
      `sec-websocket-key: ${this.key}`,
      "sec-websocket-version: 13",
      ...headers.map(([name, value]) => `${name}: ${value}`),
    ];
    return ASCII.encode(lines.join("\r\n") + "\r\n\r\n");
  }

  /** Feed bytes; return the events they complete. Throws ProtocolError. */
  receive(data: Uint8Array): WsEvent[] {
    this.buffer = concat(this.buffer, data);
    const events: WsEvent[] = [];
    if (this.rejectBody !== null) return this.rejectData(events);
    if (!this.handshaken) {
      const answer = this.answer();
      if (answer === null) return events;
      events.push(answer);
      if (answer.kind === "reject") return answer.hasBody ? this.rejectData(events) : events;
    }
    for (;;) {
      const event = this.frame();
      if (event === undefined) return events;
      if (event !== null) events.push(event);
    }
  }

  /** The bytes of a refusal's body still expected (Infinity: until the connection ends); null
   * when no refusal's body is being read. */
  private rejectBody: number | null = null;

  private rejectData(events: WsEvent[]): WsEvent[] {
    const remaining = this.rejectBody as number;
    const data = this.buffer.slice(0, Math.min(this.buffer.length, remaining));
    this.buffer = this.buffer.slice(data.length);
    this.rejectBody = remaining - data.length;
    const finished = this.rejectBody === 0;
    if (finished) this.rejectBody = null;
    if (data.length || finished) events.push({ kind: "rejectData", data, finished });
    return events;
  }

  private answer(): WsEvent | null {
    const text = Buffer.from(this.buffer).toString("latin1");
    const end = text.indexOf("\r\n\r\n");
    if (end < 0) {
      if (this.buffer.length > 65536) throw new ProtocolError("HTTP answer too long");
      return null;
    }
    this.buffer = this.buffer.slice(end + 4);
    const [status, ...lines] = text.slice(0, end).split("\r\n");
    const match = /^HTTP\/1\.[01] ([0-9]{3})/.exec(status ?? "");
    if (!match) throw new ProtocolError("not an HTTP answer");
    const code = Number(match[1]);
    const headers = new Map<string, string>();
    for (const line of lines) {
      const colon = line.indexOf(":");
      if (colon > 0) headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
    }
    if (code !== 101) {
      // As HTTP/1.1 reads a response: by Content-Length, else (chunked or not) until the end.
      const length = headers.get("content-length");
      this.rejectBody = length !== undefined && /^[0-9]+$/.test(length) ? Number(length) : Infinity;
      if (this.rejectBody === 0) this.rejectBody = null;
      return { kind: "reject", status: code, hasBody: this.rejectBody !== null };
    }
    const connection = (headers.get("connection") ?? "").toLowerCase().split(",").map((t) => t.trim());
    if (!connection.includes("upgrade")) throw new ProtocolError("Missing header, 'Connection: Upgrade'");
    if ((headers.get("upgrade") ?? "").toLowerCase() !== "websocket") {
      throw new ProtocolError("Missing header, 'Upgrade: WebSocket'");
    }
    if (headers.get("sec-websocket-accept") !== acceptFor(this.key)) throw new ProtocolError("Bad accept token");
    this.handshaken = true;
    return { kind: "accept" };
  }

  /** The next whole frame's event: undefined when incomplete, null when it makes no event. */
  private frame(): WsEvent | null | undefined {
    const b = this.buffer;
    if (b.length < 2) return undefined;
    const first = b[0] as number;
    const second = b[1] as number;
    let length = second & 0x7f;
    let offset = 2;
    if (length === 126) {
      if (b.length < 4) return undefined;
      length = ((b[2] as number) << 8) | (b[3] as number);
      offset = 4;
    } else if (length === 127) {
      if (b.length < 10) return undefined;
      length = Number(Buffer.from(b.subarray(2, 10)).readBigUInt64BE());
      offset = 10;
    }
    if (b.length < offset + length) return undefined;
    const payload = b.slice(offset, offset + length);
    this.buffer = b.slice(offset + length);
    const fin = (first & 0x80) !== 0;
    const opcode = first & 0x0f;
    if (first & 0x70) throw new ProtocolError("Reserved bit set unexpectedly");
    if (second & 0x80) throw new ProtocolError("Received a masked frame from the server");
    if (opcode >= Opcode.CLOSE) {
      if (!fin) throw new ProtocolError("Invalid attempt to fragment control frame");
      if (length > 125) throw new ProtocolError("Control frame with payload len > 125");
    }
    switch (opcode) {
      case Opcode.TEXT:
      case Opcode.BINARY:
        if (this.fragments !== null) throw new ProtocolError("Expected a continuation frame");
        this.fragments = [payload];
        this.fragmentOpcode = opcode;
        return fin ? this.message() : null;
      case Opcode.CONTINUATION:
        if (this.fragments === null) throw new ProtocolError("Unexpected continuation frame");
        this.fragments.push(payload);
        return fin ? this.message() : null;
      case Opcode.PING:
        return { kind: "ping", payload };
      case Opcode.PONG:
        return { kind: "pong" };
      case Opcode.CLOSE:
        return this.close(payload);
      default:
        throw new ProtocolError(`Unknown opcode: ${opcode}`);
    }
  }

  private message(): WsEvent {
    const parts = this.fragments ?? [];
    this.fragments = null;
    const data = Buffer.concat(parts);
    if (this.fragmentOpcode === Opcode.BINARY) return { kind: "binary", size: data.length };
    try {
      return { kind: "text", data: UTF8.decode(data) };
    } catch {
      throw new ProtocolError("Invalid UTF-8 in a text message");
    }
  }

  private close(payload: Uint8Array): WsEvent {
    if (payload.length === 0) return { kind: "close", code: 1005, reason: "" };
    if (payload.length === 1) throw new ProtocolError("Invalid close frame payload");
    const code = ((payload[0] as number) << 8) | (payload[1] as number);
    if (!VALID_CLOSE(code)) throw new ProtocolError(`Invalid close code: ${code}`);
    try {
      return { kind: "close", code, reason: UTF8.decode(payload.subarray(2)) };
    } catch {
      throw new ProtocolError("Invalid UTF-8 in a close reason");
    }
  }

  /** One masked frame. */
  frameOf(opcode: Opcode, payload: Uint8Array): Uint8Array {
    const mask = this.randomBytes(4);
    const length = payload.length;
    const head = length < 126 ? 2 : length < 65536 ? 4 : 10;
    const out = new Uint8Array(head + 4 + length);
    out[0] = 0x80 | opcode;
    if (length < 126) {
      out[1] = 0x80 | length;
    } else if (length < 65536) {
      out[1] = 0x80 | 126;
      out[2] = length >> 8;
      out[3] = length & 0xff;
    } else {
      out[1] = 0x80 | 127;
      Buffer.from(out.buffer, out.byteOffset + 2, 8).writeBigUInt64BE(BigInt(length));
    }
    out.set(mask, head);
    for (let i = 0; i < length; i++) out[head + 4 + i] = (payload[i] as number) ^ (mask[i % 4] as number);
    return out;
  }

  text(data: string): Uint8Array {
    return this.frameOf(Opcode.TEXT, ASCII.encode(data));
  }

  ping(payload: Uint8Array): Uint8Array {
    return this.frameOf(Opcode.PING, payload);
  }

  pong(payload: Uint8Array): Uint8Array {
    return this.frameOf(Opcode.PONG, payload);
  }

  /** A close frame (code 1005, "no status", sends an empty payload); only the first is sent. */
  closeFrame(code: number, reason = ""): Uint8Array {
    if (this.closed) return new Uint8Array(0);
    this.closed = true;
    if (code === 1005) return this.frameOf(Opcode.CLOSE, new Uint8Array(0));
    const body = ASCII.encode(reason);
    const payload = new Uint8Array(2 + body.length);
    payload[0] = code >> 8;
    payload[1] = code & 0xff;
    payload.set(body, 2);
    return this.frameOf(Opcode.CLOSE, payload);
  }
}

/** Decode frames a client sent (masked), for traces: [opcode name, payload]. */
export function decodeClientFrames(data: Uint8Array): [string, unknown][] {
  const out: [string, unknown][] = [];
  let pos = 0;
  while (pos + 2 <= data.length) {
    const first = data[pos] as number;
    const second = data[pos + 1] as number;
    let length = second & 0x7f;
    let offset = pos + 2;
    if (length === 126) {
      length = ((data[offset] as number) << 8) | (data[offset + 1] as number);
      offset += 2;
    } else if (length === 127) {
      length = Number(Buffer.from(data.subarray(offset, offset + 8)).readBigUInt64BE());
      offset += 8;
    }
    const masked = (second & 0x80) !== 0;
    const mask = masked ? data.subarray(offset, offset + 4) : new Uint8Array(4);
    if (masked) offset += 4;
    const payload = new Uint8Array(length);
    for (let i = 0; i < length; i++) payload[i] = (data[offset + i] as number) ^ (mask[i % 4] as number);
    pos = offset + length;
    const opcode = first & 0x0f;
    const name = Opcode[opcode] ?? String(opcode);
    if (opcode === Opcode.CLOSE) {
      const code = payload.length >= 2 ? ((payload[0] as number) << 8) | (payload[1] as number) : 1005;
      out.push([name, [code, new TextDecoder().decode(payload.subarray(2))]]);
    } else if (opcode === Opcode.TEXT) {
      out.push([name, new TextDecoder().decode(payload)]);
    } else {
      out.push([name, Buffer.from(payload).toString("hex")]);
    }
  }
  return out;
}
