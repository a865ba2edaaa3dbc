/** Replay conformance/lua/*.jsonl through a real redis-server (conformance/README.md §4): load the
 * state before, run the composed script once with EVALSHA, compare the reply, the whole database
 * after and the messages published, in the README's normal form. */

import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type { Redis } from "ioredis";
import { allChannels } from "../../src/core/keys.js";
import { byCodePoint } from "../../src/core/remote.js";
import { SCRIPT_SHA1, SCRIPT_TEXT } from "../../src/core/scripts.generated.js";
import { CONFORMANCE } from "../support/paths.js";
import { RedisServer, waitFor } from "../support/redisServer.js";

type Json = any; // eslint-disable-line @typescript-eslint/no-explicit-any
/** Every composed script this SDK carries (and so may run), each of which must have its vectors. */
const SCRIPTS = Object.keys(SCRIPT_TEXT).sort(byCodePoint);
const VECTOR_FILES = readdirSync(join(CONFORMANCE, "lua")).filter((name) => name.endsWith(".jsonl")).sort(byCodePoint);
const SENTINEL = "outpost:conformance:sentinel";
const FRESH = 10 ** 12;

function read(script: string): { header: Json; cases: Json[] } {
  const lines = readFileSync(join(CONFORMANCE, "lua", `${script}.jsonl`), "utf-8").split("\n").filter((l) => l.trim());
  const [header, ...cases] = lines.map((line) => JSON.parse(line) as Json);
  return { header, cases };
}

function list(value: Json): Json[] {
  if (value !== null && typeof value === "object" && !Array.isArray(value) && Object.keys(value).length === 0) return [];
  if (!Array.isArray(value)) throw new Error(`expected a list, got ${JSON.stringify(value)}`);
  return value;
}

function fresh(revision: Json): Json {
  const n = typeof revision === "number" ? revision : /^\s*-?[0-9]+\s*$/.test(String(revision)) ? Number(revision) : null;
  return n !== null && n >= FRESH ? "<fresh>" : revision;
}

const byFirst = (a: [string, string], b: [string, string]) => byCodePoint(a[0], b[0]) || byCodePoint(a[1], b[1]);

function normalChanges(obj: Json): Json {
  if (obj === null || typeof obj !== "object" || Array.isArray(obj) || !("c" in obj)) return obj;
  const changes = list(obj.c).map((change: Json) => {
    const out: Json = { k: change.k, r: fresh(change.r) };
    if ("s" in change) {
      const flat = list(change.s);
      const pairs: [string, string][] = [];
      for (let i = 0; i < flat.length; i += 2) pairs.push([flat[i], flat[i] === "rev" ? fresh(flat[i + 1]) : flat[i + 1]]);
      out.s = pairs.sort(byFirst);
    }
    if ("d" in change) out.d = [...list(change.d)].sort(byCodePoint);
    if ("full" in change) out.full = change.full;
    return out;
  });
  return { ...obj, c: changes };
}

async function load(client: Redis, state: Json): Promise<void> {
  await client.flushall();
  for (const [key, fields] of Object.entries(state.hashes ?? {})) {
    if (Object.keys(fields as object).length) await client.hset(key, fields as Record<string, string>);
  }
  for (const [key, members] of Object.entries<Record<string, string>>(state.zsets ?? {})) {
    const flat = Object.entries(members).flatMap(([member, score]) => [score, member]);
    if (flat.length) await client.zadd(key, ...flat);
  }
  for (const [key, stream] of Object.entries<Json>(state.streams ?? {})) {
    for (const entry of stream.entries ?? []) await client.xadd(key, entry.id, ...Object.entries(entry.fields).flat() as string[]);
    for (const [group, spec] of Object.entries<Json>(stream.groups ?? {})) {
      await client.xgroup("CREATE", key, group, "0", "MKSTREAM");
      for (const [consumer, ids] of Object.entries<string[]>(spec.pending ?? {})) {
        if (!ids.length) continue;
        const got = (await client.xreadgroup("GROUP", group, consumer, "COUNT", ids.length, "STREAMS", key, ">")) as Json;
        const read = got.flatMap(([, entries]: Json) => entries.map(([id]: Json) => id));
        assert.deepEqual(read, ids, `${key}: pending ids of ${consumer} must be the next entries`);
      }
    }
  }
}

async function dump(client: Redis, state: Json): Promise<Json> {
  const known = new Set<string>();
  for (const stream of Object.values<Json>(state.streams ?? {})) for (const entry of stream.entries ?? []) known.add(entry.id);
  const keys: string[] = [];
  let cursor = "0";
  do {
    const [next, batch] = await client.scan(cursor, "COUNT", 1000);
    cursor = next;
    keys.push(...batch);
  } while (cursor !== "0");
  const hashes: Json = {};
  const zsets: Json = {};
  const streams: Json = {};
  const ttl: Json = {};
  for (const key of keys.sort(byCodePoint)) {
    const kind = await client.type(key);
    ttl[key] = (await client.ttl(key)) >= 0 ? "set" : "none";
    if (kind === "hash") {
      const fields = await client.hgetall(key);
      if ("rev" in fields) fields.rev = fresh(fields.rev);
      hashes[key] = fields;
    } else if (kind === "zset") {
      const flat = await client.zrange(key, "0", "-1", "WITHSCORES");
      const members: Json = {};
      for (let i = 0; i < flat.length; i += 2) members[flat[i] as string] = flat[i + 1];
      zsets[key] = members;
    } else if (kind === "stream") {
      const names = new Map<string, string>();
      const name = (id: string) => {
        if (known.has(id)) return id;
        if (!names.has(id)) names.set(id, `<new:${names.size + 1}>`);
        return names.get(id) as string;
      };
      const entries = ((await client.xrange(key, "-", "+")) as [string, string[]][]).map(([id, flat]) => {
        const fields: Json = {};
        for (let i = 0; i < flat.length; i += 2) fields[flat[i] as string] = flat[i + 1];
        return { id: name(id), fields };
      });
      const groups: Json = {};
      for (const info of (await client.xinfo("GROUPS", key)) as Json[]) {
        const group = info[info.indexOf("name") + 1] as string;
        const pending: Json = {};
        for (const [id, consumer] of (await client.xpending(key, group, "-", "+", 10_000)) as Json[]) {
          (pending[consumer] ??= []).push(name(id));
        }
        groups[group] = { pending };
      }
      streams[key] = { entries, groups };
    } else {
      throw new Error(`unexpected ${kind} key ${key}`);
    }
  }
  return { hashes, zsets, streams, ttl };
}

describe("the Lua vectors, through a real redis-server", () => {
  let server: RedisServer;
  let client: Redis;
  let subscriber: Redis;
  const messages: [string, string][] = [];

  before(async () => {
    server = await RedisServer.start();
    client = server.client();
    subscriber = server.client();
    subscriber.on("smessage", (channel: string, message: string) => messages.push([channel, message]));
    await subscriber.ssubscribe(...allChannels(), SENTINEL);
  });
  after(async () => server.stop());

  /** Every message published before now (the runner publishes on a sentinel and reads to it). */
  async function drain(): Promise<[string, string][]> {
    await client.spublish(SENTINEL, "end");
    await waitFor("the sentinel message", () => (messages.some(([c]) => c === SENTINEL) ? true : undefined));
    const out = messages.splice(0).filter(([channel]) => channel !== SENTINEL);
    return out;
  }

  it("every vector file is for a script this SDK carries, and every script has one", () => {
    assert.deepEqual(VECTOR_FILES, SCRIPTS.map((script) => `${script}.jsonl`));
  });

  for (const script of SCRIPTS) {
    const { header, cases } = read(script);
    it(`${script}: recorded with the composed script this SDK runs`, () => {
      assert.equal(header.schema, "outpost-lua-vectors/1");
      assert.equal(header.sha1, SCRIPT_SHA1[script]);
    });
    for (const vector of cases) {
      it(`${script}/${vector.name}`, async () => {
        await load(client, vector.before);
        await drain();
        const sha = (await client.script("LOAD", SCRIPT_TEXT[script] as string)) as string;
        const raw = (await client.evalsha(sha, vector.keys.length, ...vector.keys, ...vector.argv)) as string | string[];
        const published = await drain();
        // A pair [published text, reply] is the list of both in normal form.
        const reply = Array.isArray(raw) ? raw.map((part) => normalChanges(JSON.parse(part))) : normalChanges(JSON.parse(raw));
        assert.deepEqual(reply, vector.reply, vector.description);
        assert.deepEqual(await dump(client, vector.before), vector.after, vector.description);
        const got = published.map(([channel, data]) => ({ channel, message: normalChanges(JSON.parse(data)) }));
        assert.deepEqual(got, vector.published, vector.description);
      });
    }
  }
});
