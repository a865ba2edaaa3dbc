/** An Express app that meters one endpoint with Outpost (the TypeScript twin of
 * examples/flask_app). `GET /generate` serves one request for the customer named in the
 * `X-Customer-Id` header (or the `customer` query parameter): it reads the customer's balance,
 * answers 402 when it is exhausted, and otherwise tracks one `api_call` event and does the work.
 *
 * Run it from ts/ with `OUTPOST_METER_ID=<meter> npx tsx examples/express/main.ts`;
 * POLAR_ACCESS_TOKEN, POLAR_SERVER_URL and REDIS_URL are read by Outpost itself. */

import express, { type Express } from "express";
import { NotReady, type Outpost, RedisUnavailable } from "../../src/index.js";

export function createApp(outpost: Outpost, meterId: string): Express {
  const app = express();

  app.get("/generate", async (request, response) => {
    const customer = request.get("X-Customer-Id") ?? (typeof request.query.customer === "string" ? request.query.customer : "");
    if (!customer) {
      response.status(400).json({ error: "name the customer: X-Customer-Id header or ?customer=" });
      return;
    }
    try {
      const balance = await outpost.balance(meterId, { externalCustomerId: customer });
      if (balance.balance <= 0) {
        response.status(402).json({
          error: "usage limit reached: buy more credits",
          customer,
          balance: balance.balance,
          credited: balance.credited,
          consumed: balance.consumed,
        });
        return;
      }
      await outpost.track("api_call", { externalCustomerId: customer, metadata: { route: "generate" } });
      // track() has already updated this instance's copy: no network call here.
      const after = await outpost.balance(meterId, { externalCustomerId: customer });
      response.json({ customer, result: "generated", balance: after.balance });
    } catch (exc) {
      if (exc instanceof NotReady || exc instanceof RedisUnavailable) {
        // Polar's first snapshot did not come in time, or Redis is down (nothing was tracked).
        response.status(503).set("Retry-After", "1").json({ error: `usage metering is not available: ${exc.message}` });
        return;
      }
      throw exc;
    }
  });

  return app;
}
