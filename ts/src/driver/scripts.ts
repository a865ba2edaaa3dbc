/** Running the Lua scripts: EVALSHA, and EVAL where Redis lost them. */

import type { Cluster, Redis } from "ioredis";
import { SCRIPT_SHA1, SCRIPT_TEXT } from "../core/scripts.generated.js";
import { reachable, redisUnavailable } from "./connections.js";

/** Run script `name`; Redis failing rejects with RedisUnavailable (`raw`: with the client's own
 * error), a bug of ours with itself. */
export async function runScript(client: Redis | Cluster, name: string, keys: string[], args: string[], raw = false): Promise<unknown> {
  if (raw) return evalScript(name, keys, args, client);
  try {
    return await evalScript(name, keys, args, client);
  } catch (exc) {
    throw redisUnavailable(`running ${name}`, exc, client);
  }
}

async function evalScript(name: string, keys: string[], args: string[], client: Redis | Cluster): Promise<unknown> {
  reachable(client);
  try {
    return await client.evalsha(SCRIPT_SHA1[name] as string, keys.length, ...keys, ...args);
  } catch (exc) {
    if (!String(exc).includes("NOSCRIPT")) throw exc;
    return await client.eval(SCRIPT_TEXT[name] as string, keys.length, ...keys, ...args);
  }
}
