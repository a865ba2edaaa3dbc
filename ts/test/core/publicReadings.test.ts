/** Webhook signatures and Polar's customer-meter rows (tests/core/test_webhook_signature.py and
 * test_public_readings.py have the same cases; the signature below is the Python core's). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { UsageError } from "../../src/core/errors.js";
import { MAX_BODY_BYTES, parseCustomerMeters, parseStateChanged } from "../../src/core/publicReadings.js";
import { secretKey, sign, verify } from "../../src/core/webhookSignature.js";

const te = new TextEncoder();
const KEY = te.encode("0123456789abcdef0123");
const SECRET = `whsec_${Buffer.from(KEY).toString("base64")}`;
const BODY = te.encode('{"type":"customer.state_changed"}');
const NOW = 1_796_223_720;
const PYTHON = "v1,wj69TSzfK4uCGyv0QXyYGEZG8Gzz0i6QPilKU171xr8=";

const headers = (body = BODY, at = NOW, key = KEY) => ({
  "Webhook-Id": "msg_1",
  "webhook-timestamp": String(at),
  "webhook-signature": `v1,bogus ${sign(key, "msg_1", at, body)}`,
});

describe("webhook signatures", () => {
  it("sign as the Python core does and verify", () => {
    assert.equal(sign(KEY, "msg_1", NOW, BODY), PYTHON);
    assert.deepEqual(secretKey(SECRET), KEY);
    assert.throws(() => secretKey("whsec_not base64!"), UsageError);
    assert.throws(() => secretKey("whsec_"), UsageError);
    assert.equal(verify(KEY, headers(), BODY, NOW + 10).genuine, true);
  });

  it("refuse what does not hold, with a reason", () => {
    const cases: [Record<string, string>, Uint8Array, number, string][] = [
      [{}, BODY, NOW, "missing"],
      [{ ...headers(), "webhook-timestamp": "soon" }, BODY, NOW, "Unix seconds"],
      [headers(), BODY, NOW + 301, "too far"],
      [headers(), te.encode('{"type":"x"}'), NOW, "no signature"],
      [headers(BODY, NOW, te.encode("other")), BODY, NOW, "no signature"],
    ];
    for (const [h, body, now, reason] of cases) {
      const verdict = verify(KEY, h, body, now);
      assert.equal(verdict.genuine, false);
      assert.ok(verdict.reason.includes(reason), verdict.reason);
    }
  });
});

const ROW = { meter_id: "m1", consumed_units: 2.5, credited_units: 10, balance: 7.5, modified_at: "2026-12-02T15:02:00.000123Z" };
const hook = (rows: unknown[], extra: Record<string, unknown> = {}) =>
  te.encode(JSON.stringify({ type: "customer.state_changed", data: { external_id: "acme", id: "u1", ...extra, active_meters: rows } }));

describe("readings", () => {
  it("from a webhook", () => {
    const [readings, rejected] = parseStateChanged(hook([ROW, { ...ROW, meter_id: "m2", modified_at: null }]));
    assert.deepEqual(rejected, []);
    assert.equal(readings[0]?.modifiedAtUs, 1_796_223_720_000_123);
    assert.equal(readings[1]?.modifiedAtUs, null);
    assert.equal(readings[0]?.externalCustomerId, "acme");
  });

  it("say where each meter's window began (the period of the subscription carrying it)", () => {
    const subscriptions = [
      { current_period_start: "2026-12-01T00:00:00Z", meters: [{ meter_id: "m1" }] },
      { current_period_start: "2026-12-02T00:00:00Z", meters: [{ meter_id: "m1" }, 3] },
      { current_period_start: "2026-11-01T00:00:00Z", meters: [{ meter_id: "m1" }] },
      { current_period_start: null, meters: [{ meter_id: "m2" }] },
      { current_period_start: "later", meters: [] },
      { current_period_start: "2026-12-01T00:00:00Z", meters: "m2" },
      "x",
    ];
    const [readings, rejected] = parseStateChanged(hook([ROW, { ...ROW, meter_id: "m2" }], { active_subscriptions: subscriptions }));
    assert.deepEqual(readings.map((r) => r.resetAtUs), [1_796_169_600_000_000, null]);
    assert.deepEqual(rejected.map((r) => r.reason), Array(4).fill("a subscription without its period start or meters"));
    assert.equal(parseStateChanged(hook([ROW], { active_subscriptions: "x" }))[0][0]?.resetAtUs, null);
  });

  it("count bad rows and bodies, never throw", () => {
    const bad = ["x", { ...ROW, meter_id: 3 }, { ...ROW, consumed_units: "2" }, { ...ROW, credited_units: 1.5 },
      { ...ROW, modified_at: 5 }, { ...ROW, modified_at: "yesterday" }, { ...ROW, modified_at: "2026-12-02T15:02:00" },
      { ...ROW, modified_at: "2026-13-45T15:02:00Z" }];
    for (const row of bad) {
      const [readings, rejected] = parseStateChanged(hook([row, ROW]));
      assert.equal(readings.length, 1);
      assert.equal(rejected.length, 1, JSON.stringify(row));
    }
    assert.match(parseStateChanged(te.encode("{"))[1][0]?.reason ?? "", /^not JSON/);
    assert.match(parseStateChanged(new Uint8Array(MAX_BODY_BYTES + 1))[1][0]?.reason ?? "", /bytes/);
    assert.deepEqual(parseStateChanged(te.encode('{"type":"order.paid"}')), [[], []]);
    assert.equal(parseStateChanged(te.encode('{"type":"customer.state_changed","data":{}}'))[1].length, 1);
    assert.match(parseStateChanged(hook([ROW], { external_id: null, id: null }))[1][0]?.reason ?? "", /no customer/);
  });

  it("from a customer-meters page", () => {
    const items = [
      { ...ROW, customer_id: "u1", customer: { external_id: "acme" } },
      { ...ROW, customer_id: null, customer: null, external_customer_id: "ext" },
      { ...ROW, customer_id: "u2", customer: { external_id: null } },
      "junk",
    ];
    const [readings, rejected] = parseCustomerMeters(te.encode(JSON.stringify({ items })));
    assert.deepEqual(readings.map((r) => [r.externalCustomerId, r.customerId]), [["acme", "u1"], ["ext", null], [null, "u2"]]);
    assert.equal(rejected.length, 1);
    assert.equal(parseCustomerMeters(te.encode("nope"))[1].length, 1);
    assert.equal(parseCustomerMeters(te.encode("{}"))[1].length, 1);
  });
});
