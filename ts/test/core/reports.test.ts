/** The session never logs: it queues the lines its driver should log, and reports() drains them.
 * A session nobody drains keeps only the newest lines, and says how many it let go. */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { KEPT, Reports } from "../../src/core/reports.js";
import { Session } from "../../src/core/session.js";
import { REPO } from "../support/paths.js";

const CONFIGURATION = {
  organization_id: "org",
  reducers: [{ id: "r-count", filter: { conjunction: "and", clauses: [] }, aggregation: { func: "count" }, meter_ids: ["m-count"] }],
};
const KEY = "outpost:v2:{10}:external:c1:r-count";

function configured(): Session {
  const session = new Session();
  session.handle({ kind: "ConfigurationReceived", payload: CONFIGURATION, fromCache: false });
  session.handle({ kind: "SubscriberRestarted" });
  session.effects();
  return session;
}

describe("a session's reports", () => {
  it("are a read's load and what it loaded, at debug, drained once", () => {
    const session = configured();
    assert.deepEqual(session.reports(), []);
    assert.equal(session.read("m-count", "c1"), null);
    assert.deepEqual(session.reports(), [{ level: "debug", message: `outpost loads ${KEY} (copy at revision -1)` }]);
    const [load] = session.effects();
    assert.equal(load?.kind, "LoadIdentity");
    session.handle({ kind: "IdentityLoaded", key: KEY, fields: new Map([["rev", "4"]]), loadId: 1 });
    assert.deepEqual(session.reports(), [{ level: "debug", message: `outpost loaded ${KEY} at revision 4` }]);
    assert.deepEqual(session.reports(), []);
  });

  it("keep the newest lines of a session nobody drains, after one that counts the others", () => {
    const session = configured();
    const channels = Array.from({ length: KEPT + 5 }, (_, n) => `not-ours-${n}`);
    session.handle({ kind: "ChannelsLost", channels });
    assert.equal(session.rejections.get("subscription"), KEPT + 5);
    const [first, ...kept] = session.reports();
    assert.deepEqual(first, { level: "warning", message: "outpost let go of 5 older log lines no one collected in time" });
    assert.equal(kept.length, KEPT);
    assert.ok(kept[0]?.message.includes("not-ours-5"));
    assert.ok(kept.at(-1)?.message.includes(`not-ours-${KEPT + 4}`));
    assert.deepEqual(session.reports(), []); // the count starts again
  });

  it("say lines let go at the level of the most severe of them", () => {
    const reports = new Reports(2);
    for (const level of ["debug", "debug", "info"] as const) reports.add(level, "line");
    assert.deepEqual(reports.drain()[0], { level: "debug", message: "outpost let go of 1 older log lines no one collected in time" });
    reports.relay(null); // nothing to say
    for (const level of ["warning", "debug", "debug", "debug"] as const) reports.relay({ level, message: "line" });
    assert.deepEqual(reports.drain().map((r) => r.level), ["warning", "debug", "debug"]);
    assert.deepEqual(reports.drain(), []);
  });

  it("are the core's only way to say something: no module of the core logs", () => {
    const core = join(REPO, "ts", "src", "core");
    for (const name of readdirSync(core)) {
      const text = readFileSync(join(core, name), "utf8");
      assert.doesNotMatch(text, /\bconsole\.|\bLogger\b|\.log\.(debug|info|warn)\(/, `${name} logs`);
    }
  });
});
