/** Polar's ingestion API: one batch's request and its answer, for a delivery loop. */

import { type BatchAnswered, type BatchFailed, retryAfter } from "../core/delivery.js";
import { type DriverContext, USER_AGENT } from "./context.js";
import { readAtMost } from "./http.js";

/** The most of an ingestion answer read (its error detail): 1 MiB. */
const MAX_ANSWER = 1 << 20;

/** POST one batch's body to /v1/events/ingest (aborted when the instance closes). */
export async function post(ctx: DriverContext, body: Uint8Array): Promise<BatchAnswered | BatchFailed> {
  let response: Response;
  try {
    response = await fetch(new URL("/v1/events/ingest", ctx.serverUrl), {
      method: "POST",
      body,
      headers: { authorization: `Bearer ${ctx.accessToken}`, "content-type": "application/json", "user-agent": USER_AGENT },
      signal: AbortSignal.any([AbortSignal.timeout(30_000), ctx.closing.signal]),
    });
  } catch (exc) {
    const code = (exc as { cause?: { code?: string } }).cause?.code ?? "";
    const refused = ["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH", "UND_ERR_CONNECT_TIMEOUT"];
    if (refused.includes(code)) return { kind: "BatchFailed", reason: `could not connect to Polar: ${code}`, maybeSent: false };
    return { kind: "BatchFailed", reason: `ingestion request failed: ${String(exc)}`, maybeSent: true };
  }
  let content: Uint8Array;
  try {
    content = await readAtMost(response, MAX_ANSWER);
  } catch (exc) {
    return { kind: "BatchFailed", reason: `ingestion request failed: ${String(exc)}`, maybeSent: true };
  }
  const wait = retryAfter(response.headers.get("retry-after"), ctx.nowUs());
  return { kind: "BatchAnswered", status: response.status, body: content, retryAfter: wait };
}
