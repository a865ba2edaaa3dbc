/** The WebSocket's socket: opened when the core asks (OpenConnection), its bytes fed to the core
 * as they come, written when the core sends, closed when the core drops it. The core speaks the
 * WebSocket protocol; this only moves its bytes. */

import { connect as netConnect, type Socket } from "node:net";
import { connect as tlsConnect } from "node:tls";
import type { Input } from "../core/inputs.js";
import { cannotConnect } from "./connections.js";
import type { DriverContext } from "./context.js";
import { monotonic } from "./signal.js";

interface Open {
  socket: Socket;
  /** The core was told this socket's end (or needs not be). */
  reported: boolean;
}

export class LinkSocket {
  private link: Open | null = null;

  constructor(
    private readonly ctx: DriverContext,
    /** Hands the core one input and runs what it asks for. */
    private readonly feed: (input: Input) => void,
  ) {}

  open(host: string, port: number, tls: boolean, timeout: number): void {
    if (this.ctx.closed) return;
    const socket = tls ? tlsConnect({ host, port, servername: host }) : netConnect({ host, port });
    const link: Open = { socket, reported: false };
    let opened = false;
    const fail = (reason: string) => {
      if (link.reported) return;
      link.reported = true;
      if (this.link === link) this.link = null;
      socket.destroy();
      this.feed({ kind: "ConnectionFailed", now: monotonic(), reason });
    };
    const timer = setTimeout(() => fail(`cannot connect to ${host}:${port}: timed out`), timeout * 1000);
    socket.setNoDelay(true);
    socket.once(tls ? "secureConnect" : "connect", () => {
      clearTimeout(timer);
      if (link.reported || this.ctx.closed) return socket.destroy();
      opened = true;
      this.link = link;
      this.feed({ kind: "ConnectionOpened", now: monotonic() });
    });
    socket.on("data", (data: Buffer) => {
      if (link.reported) return;
      this.feed({ kind: "BytesReceived", now: monotonic(), data: new Uint8Array(data) });
    });
    socket.on("end", () => {
      if (link.reported) return;
      link.reported = true; // the core learns of the end from the empty read
      if (this.link === link) this.link = null;
      this.feed({ kind: "BytesReceived", now: monotonic(), data: new Uint8Array(0) });
      socket.destroy();
    });
    socket.on("error", (exc: Error) => {
      clearTimeout(timer);
      fail(opened ? `connection lost: ${exc.message}` : cannotConnect(exc, host, port));
    });
    socket.on("close", () => {
      clearTimeout(timer);
      fail("connection lost: closed");
    });
  }

  send(data: Uint8Array): void {
    const link = this.link;
    if (link === null || link.socket.destroyed) return; // asked again on reconnect
    link.socket.write(data);
  }

  /** The core dropped the connection (or the instance closes): close the socket without telling
   * the core again; destroyed if Polar lingers after the close frame. */
  drop(): void {
    const link = this.link;
    this.link = null;
    if (link === null) return;
    link.reported = true;
    link.socket.end();
    setTimeout(() => link.socket.destroy(), 1000).unref();
  }
}
