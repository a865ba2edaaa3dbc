/** What a customer's hashes hold on one Redis server (a replica's too): its events and holds. */

import type { Redis } from "ioredis";
import { Customer, customerPrefix } from "../../src/core/index.js";

/** The fields of the customer's hashes on one server (`:ev:` ones: its events' hashes). */
export async function fieldsOn(client: Redis, customer: string, events: boolean, shards = 16): Promise<string[]> {
  const prefix = customerPrefix(new Customer("external", customer), shards);
  const keys: string[] = [];
  let cursor = "0";
  do {
    const [next, found] = await client.scan(cursor, "MATCH", `${prefix}:*`, "COUNT", 1000);
    cursor = next;
    keys.push(...found);
  } while (cursor !== "0");
  const fields: string[] = [];
  for (const key of keys) {
    if (key.includes(":ev:") !== events || (await client.type(key)) !== "hash") continue;
    fields.push(...(await client.hkeys(key)));
  }
  return fields;
}

export const holds = (fields: string[]) => fields.filter((field) => field.startsWith("h:"));
export const hasEvent = (fields: string[], eventId: string) => fields.some((field) => field.endsWith(eventId));
