/** Secrets out of every output: URLs printed with their password masked, known secrets scrubbed
 * from texts, and the warning for a token sent over plain http:// to another machine. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { cleartextTokenWarning, cleartextWarnings, redactUrl, scrub, scrubbing, urlSecrets } from "../../src/driver/redact.js";

describe("redaction", () => {
  it("masks a URL's password and password-like query values, keeping the rest", () => {
    assert.equal(redactUrl("redis://:pw@127.0.0.1:6379/0"), "redis://:***@127.0.0.1:6379/0");
    assert.equal(redactUrl("rediss://bob:pw@h:6380/1"), "rediss://bob:***@h:6380/1");
    assert.equal(redactUrl("redis://token@h"), "redis://***@h"); // a bare user info may be a token
    assert.equal(redactUrl("redis://h/0?password=pw&db=2#x"), "redis://h/0?password=***&db=2#x");
    assert.equal(redactUrl("redis://h:6379/0"), "redis://h:6379/0");
    assert.equal(redactUrl("not a url, but //u:pw@h"), "not a url, but //u:***@h");
  });

  it("lists a URL's secrets, and scrubs them (and any URL's password) from a text", () => {
    assert.deepEqual(urlSecrets("redis://bob:p%40ss@h/0?token=t1").sort(), ["p%40ss", "p@ss", "t1"]);
    assert.deepEqual(urlSecrets("redis://tok@h"), ["tok"]);
    assert.deepEqual(urlSecrets("::"), []);
    assert.equal(scrub("p@ss and t1 at redis://x:y@h", ["p@ss", "t1", null, ""]), "*** and *** at redis://x:***@h");
    const lines: string[] = [];
    const push = (m: string) => lines.push(m);
    const logger = scrubbing({ debug: push, warn: push, info: push, error: push }, ["secret", null]);
    logger.debug("a secret");
    logger.warn("secret!");
    logger.info?.("no secret here");
    logger.error?.("secret, loudly");
    assert.deepEqual(lines, ["a ***", "***!", "no *** here", "***, loudly"]);
    const bare = scrubbing({ debug: () => {}, warn: () => {} }, []);
    assert.equal(bare.info, undefined);
    assert.equal(bare.error, undefined);
  });

  it("warns about a token over plain http:// to a host that is not this machine", () => {
    assert.match(cleartextTokenWarning("http://u:pw@polar.internal:8000", "server URL") ?? "", /^outpost sends the access token to the server URL http:\/\/u:\*\*\*@polar\.internal:8000 over plain http:\/\//);
    for (const url of ["https://polar.internal", "http://localhost:8000", "http://api.localhost", "http://127.0.0.5", "http://[::1]:8000", "not a url"]) {
      assert.equal(cleartextTokenWarning(url, "server URL"), null, url);
    }
    assert.deepEqual(cleartextWarnings(null, "http://a", true, "http://b"), []);
    assert.equal(cleartextWarnings("t", "http://a", true, "http://a").length, 1); // the same URL once
    assert.equal(cleartextWarnings("t", "http://a", false, "http://b").length, 1); // no telemetry
    assert.equal(cleartextWarnings("t", "http://a", true, "http://b").length, 2);
  });
});
