/** The core's own cost per track() (validation, matching, keys, JSON), after warm-up. */
import { Session, makeSettings } from "../src/core/session.js";

const session = new Session(makeSettings());
session.handle({ kind: "ConfigurationReceived", payload: { reducers: [{ id: "r", filter: { conjunction: "and", clauses: [{ property: "name", operator: "eq", value: "a" }] }, aggregation: { func: "count" }, meter_ids: ["m"] }] }, fromCache: true });
const now = 1_796_000_000_000_000;
for (let round = 0; round < 3; round++) {
  const n = 50_000;
  const start = process.hrtime.bigint();
  for (let k = 0; k < n; k++) session.track({ name: "a", externalCustomerId: "bench", metadata: { tokens: 3 }, timestampUs: now, nowUs: now, eventId: `e${k}` });
  console.log(`core track(): ${(Number(process.hrtime.bigint() - start) / n / 1000).toFixed(2)} µs`);
}
