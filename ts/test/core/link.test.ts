/** The sans-IO WebSocket link, byte for byte: what Polar's side sends is built here. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Link, LinkState, Target, Unreadable } from "../../src/core/link.js";
import { UsageError } from "../../src/core/errors.js";
import { acceptFor, decodeClientFrames } from "../../src/core/websocket.js";
import { replayBytes } from "../../src/core/trace.js";

const te = new TextEncoder();
const fixed = { random: () => 0.5 };

function serverFrame(opcode: number, payload: Uint8Array, fin = true, extra = 0): Uint8Array {
  const head = payload.length < 126 ? [((fin ? 0x80 : 0) | opcode | extra), payload.length] : [((fin ? 0x80 : 0) | opcode | extra), 126, payload.length >> 8, payload.length & 0xff];
  return Uint8Array.from([...head, ...payload]);
}
const text = (s: string, fin = true, opcode = 1) => serverFrame(opcode, te.encode(s), fin);

function openLink(): Link {
  const link = new Link(Target.of("http://127.0.0.1:8000"), "token", fixed, replayBytes());
  assert.ok(link.wantsConnection(0));
  link.opened(0);
  const request = Buffer.from(link.dataToSend()).toString("latin1");
  const key = /sec-websocket-key: (\S+)/.exec(request)?.[1] as string;
  const answer = `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${acceptFor(key)}\r\n\r\n`;
  assert.deepEqual(link.receive(te.encode(answer), 0.1), []);
  assert.equal(link.state, LinkState.OPEN);
  return link;
}

describe("the WebSocket link", () => {
  it("finds where the WebSocket lives", () => {
    assert.deepEqual(Target.of("https://api.polar.sh"), new Target("api.polar.sh", 443, true));
    assert.deepEqual(Target.of("http://[::1]:81/x"), new Target("::1", 81, false));
    assert.throws(() => Target.of("ftp://x"), UsageError);
    assert.throws(() => Target.of("not a url"), UsageError);
  });

  it("upgrades with the token and turns text frames (whole or in parts) into messages", () => {
    const link = openLink();
    assert.equal(link.connections, 1);
    assert.deepEqual(link.receive(text('{"type":"a"}'), 1), [{ type: "a" }]);
    const parts = [...text('{"ty', false), ...text('pe":"b"}', true, 0)];
    assert.deepEqual(link.receive(Uint8Array.from(parts.slice(0, 5)), 1), []);
    assert.deepEqual(link.receive(Uint8Array.from(parts.slice(5)), 1), [{ type: "b" }]);
    const [message] = link.receive(text("not json"), 1);
    assert.ok(message instanceof Unreadable);
    assert.ok(link.receive(serverFrame(2, Uint8Array.of(1, 2)), 1)[0] instanceof Unreadable);
    assert.ok(link.send({ type: "configuration" }));
    assert.deepEqual(decodeClientFrames(link.dataToSend()), [["TEXT", '{"type":"configuration"}']]);
  });

  it("answers pings, pings a quiet Polar, and gives up on a dead one", () => {
    const link = openLink();
    link.receive(serverFrame(9, te.encode("hi")), 1);
    assert.deepEqual(decodeClientFrames(link.dataToSend()), [["PONG", Buffer.from("hi").toString("hex")]]);
    link.tick(21);
    assert.deepEqual(decodeClientFrames(link.dataToSend()), [["PING", Buffer.from("outpost").toString("hex")]]);
    assert.equal(link.nextDeadline(), 41);
    link.tick(42);
    assert.equal(link.state, LinkState.DISCONNECTED);
    assert.match(link.lastError ?? "", /no frame from Polar for 40 s/);
    assert.ok(link.retryAt > 42);
  });

  it("echoes Polar's close and drops; an empty read is Polar closing", () => {
    const link = openLink();
    link.receive(serverFrame(8, Uint8Array.of(0x03, 0xf4)), 1); // 1012
    assert.deepEqual(decodeClientFrames(link.dataToSend()), [["CLOSE", [1012, ""]]]);
    assert.equal(link.state, LinkState.DISCONNECTED);
    const other = openLink();
    other.receive(new Uint8Array(0), 2);
    assert.equal(other.lastError, "Polar closed the connection");
  });

  it("drops on protocol errors", () => {
    const cases: [Uint8Array, RegExp][] = [
      [serverFrame(1, te.encode("x"), true, 0x40), /Reserved bit/],
      [Uint8Array.of(0x81, 0x81, 1, 2, 3, 4, 5), /masked frame/],
      [serverFrame(3, new Uint8Array(0)), /Unknown opcode/],
      [serverFrame(0, te.encode("x")), /continuation/],
      [serverFrame(9, te.encode("x"), false), /fragment control/],
      [serverFrame(8, Uint8Array.of(3)), /close frame/],
      [serverFrame(8, Uint8Array.of(0x03, 0xed)), /close code/], // 1005 is local only
      [serverFrame(1, Uint8Array.of(0xff)), /UTF-8/],
      [Uint8Array.from([...text("a", false), ...text("b")]), /continuation frame/],
      [serverFrame(8, Uint8Array.of(0x03, 0xe8, 0xff)), /close reason/],
    ];
    for (const [bytes, reason] of cases) {
      const link = openLink();
      link.receive(bytes, 1);
      assert.equal(link.state, LinkState.DISCONNECTED, String(reason));
      assert.match(link.lastError ?? "", reason);
      assert.equal(link.peerErrors, 1);
    }
  });

  it("refuses a bad accept key, backs off after a refusal, and times out a silent upgrade", () => {
    const link = new Link(Target.of("http://h"), "t", fixed, replayBytes());
    link.wantsConnection(0);
    link.opened(0);
    link.receive(te.encode("HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: nope\r\n\r\n"), 0);
    assert.match(link.lastError ?? "", /accept/);
    assert.ok(link.retryAt < 1);
    link.wantsConnection(10);
    link.opened(10);
    link.receive(te.encode("HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n"), 10);
    assert.equal(link.refused, "Polar refused the WebSocket with HTTP 401");
    assert.equal(link.refusedStatus, 401);
    assert.equal(link.retryAt, 70);
    assert.equal(link.wantsConnection(69), false);
    assert.ok(link.wantsConnection(70));
    link.opened(70);
    link.tick(81);
    assert.equal(link.lastError, "Polar did not answer the WebSocket upgrade");
    assert.throws(() => link.opened(82), UsageError);
  });

  it("says why Polar refused, from the refusal's body, whole or in parts or ended by the connection", () => {
    const refuse = (...parts: string[]): Link => {
      const link = new Link(Target.of("http://h"), "t", fixed, replayBytes());
      link.wantsConnection(0);
      link.opened(0);
      for (const part of parts) link.receive(te.encode(part), 0);
      return link;
    };
    const json = '{"detail":"invalid token"}';
    const head = `HTTP/1.1 403 Forbidden\r\ncontent-length: ${json.length}\r\n\r\n`;
    assert.equal(refuse(head + json).refused, "Polar refused the WebSocket with HTTP 403: invalid token");
    const parted = refuse(head, json.slice(0, 5));
    assert.equal(parted.refused, null);
    parted.receive(te.encode(json.slice(5)), 0);
    assert.equal(parted.refused, "Polar refused the WebSocket with HTTP 403: invalid token");
    const untilEnd = refuse("HTTP/1.1 500 Oops\r\n\r\n", "plain words ");
    untilEnd.receive(new Uint8Array(), 0);
    assert.equal(untilEnd.refused, "Polar refused the WebSocket with HTTP 500: plain words");
    assert.equal(untilEnd.retryAt, 0.1875); // not a token problem: the usual backoff
    const other = refuse(`HTTP/1.1 401 No\r\ncontent-length: 27\r\n\r\n{"detail": [{"msg": "é", "n": 1.5}]}`.replace("27", String(Buffer.byteLength('{"detail": [{"msg": "é", "n": 1.5}]}'))));
    assert.equal(other.refused, 'Polar refused the WebSocket with HTTP 401: [{"msg": "\\u00e9", "n": 1.5}]'); // as Python's json.dumps
    assert.equal(refuse(`HTTP/1.1 401 No\r\ncontent-length: 2\r\n\r\n""`).refused, "Polar refused the WebSocket with HTTP 401");
  });

  it("reads a 64-bit frame length, and refuses a broken upgrade answer", () => {
    const link = openLink();
    assert.deepEqual(link.receive(Uint8Array.of(0x81, 127, 0, 0, 0, 0, 0, 0, 0, 2, 0x7b), 1), []);
    assert.deepEqual(link.receive(Uint8Array.of(0x7d), 1), [{}]);
    const answers: [string, RegExp][] = [
      ["HTTP/1.1 101 S\r\nConnection: Upgrade\r\n\r\n", /Upgrade: WebSocket/],
      ["HTTP/1.1 101 S\r\nUpgrade: websocket\r\n\r\n", /Connection: Upgrade/],
      ["SSH-2.0\r\n\r\n", /not an HTTP answer/],
      [`HTTP/1.1 101 S\r\n${"x: y\r\n".repeat(12_000)}`, /too long/],
    ];
    for (const [answer, reason] of answers) {
      const fresh = new Link(Target.of("http://h"), "t", fixed, replayBytes());
      fresh.wantsConnection(0);
      fresh.opened(0);
      fresh.receive(te.encode(answer), 0);
      assert.match(fresh.lastError ?? "", reason);
    }
  });

  it("closes for good with a close frame", () => {
    const link = openLink();
    link.close();
    assert.deepEqual(decodeClientFrames(link.dataToSend()), [["CLOSE", [1000, ""]]]);
    assert.equal(link.state, LinkState.CLOSED);
    link.failed(5, "late");
    assert.equal(link.state, LinkState.CLOSED);
    assert.equal(link.nextDeadline(), null);
    assert.equal(link.send({ type: "x" }), false);
  });

  it("ignores a connection that opens after close()", () => {
    const link = new Link(Target.of("http://h"), "t", fixed, replayBytes());
    assert.ok(link.wantsConnection(0));
    link.close(); // the client closes while the driver is still connecting
    link.opened(1);
    assert.equal(link.state, LinkState.CLOSED);
    assert.equal(link.dataToSend().length, 0);
  });

  it("refuses a message over the size limit", () => {
    const link = new Link(Target.of("http://h"), "t", fixed, replayBytes(), { maxMessage: 10 });
    link.wantsConnection(0);
    link.opened(0);
    const key = /sec-websocket-key: (\S+)/.exec(Buffer.from(link.dataToSend()).toString("latin1"))?.[1] as string;
    link.receive(te.encode(`HTTP/1.1 101 S\r\nUpgrade: websocket\r\nConnection: upgrade\r\nSec-WebSocket-Accept: ${acceptFor(key)}\r\n\r\n`), 0);
    link.receive(text('{"a":"0123456789"}'), 1);
    assert.equal(link.lastError, "Polar sent a message over the size limit");
  });
});
