/** An Express app that meters one endpoint with Outpost (the TypeScript twin of
 * examples/flask_app). `GET /generate` serves one request for the customer named in the
 * `X-Customer-Id` header (or the `customer` query parameter): it reserves an estimate of the
 * request's usage (one unit), exactly across every instance sharing the Redis, answers 402 when the
 * available balance does not cover it, and otherwise does the work and commits the actual usage
 * (one `api_call` event). `POST /webhooks/polar` takes Polar's webhooks: where Polar serves only its
 * public API (Outpost's public mode), a `customer.state_changed` delivery brings a customer's new
 * figures (a credit grant, a recomputed usage) to every instance at once; set the endpoint's secret
 * in POLAR_WEBHOOK_SECRET.
 *
 * Run it from ts/ with `OUTPOST_METER_ID=<meter> npx tsx examples/express/main.ts`;
 * POLAR_ACCESS_TOKEN, POLAR_SERVER_URL and REDIS_URL are read by Outpost itself. */

import express, { type Express } from "express";
import { InsufficientBalance, InvalidWebhook, NotReady, type Outpost, RedisUnavailable } from "../../src/index.js";

export function createApp(outpost: Outpost, meterId: string): Express {
  const app = express();

  app.get("/generate", async (request, response) => {
    const customer = request.get("X-Customer-Id") ?? (typeof request.query.customer === "string" ? request.query.customer : "");
    if (!customer) {
      response.status(400).json({ error: "name the customer: X-Customer-Id header or ?customer=" });
      return;
    }
    try {
      // Hold the estimate; released when the block exits uncommitted (or when it expires).
      await using reservation = await outpost.reserve(meterId, 1, { externalCustomerId: customer });
      // ... the work goes here; then record what it actually used:
      await reservation.commit("api_call", { metadata: { route: "generate" } });
      // commit() has already updated this instance's copy: no network call here.
      const after = await outpost.balance(meterId, { externalCustomerId: customer });
      response.json({ customer, result: "generated", balance: after.balance });
    } catch (exc) {
      if (exc instanceof InsufficientBalance) {
        const balance = await outpost.balance(meterId, { externalCustomerId: customer });
        response.status(402).json({
          error: "usage limit reached: buy more credits",
          customer,
          balance: balance.balance,
          credited: balance.credited,
          consumed: balance.consumed,
        });
        return;
      }
      if (exc instanceof NotReady || exc instanceof RedisUnavailable) {
        // Polar's first snapshot did not come in time, or Redis is down (nothing was tracked).
        response.status(503).set("Retry-After", "1").json({ error: `usage metering is not available: ${exc.message}` });
        return;
      }
      throw exc;
    }
  });

  // The raw body: the signature is over the bytes Polar sent, not over a parsed object.
  app.post("/webhooks/polar", express.raw({ type: "*/*", limit: "10mb" }), async (request, response) => {
    try {
      const body = Buffer.isBuffer(request.body) ? request.body : Buffer.alloc(0);
      response.status(await outpost.handleWebhook(body, request.headers)).end();
    } catch (exc) {
      if (exc instanceof InvalidWebhook) response.status(401).end(); // not from Polar: nothing taken
      else if (exc instanceof RedisUnavailable) response.status(503).end(); // Polar delivers it again later
      else throw exc;
    }
  });

  return app;
}
