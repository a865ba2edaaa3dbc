/** Polar's ingestion API: one batch's request and its answer, for a delivery loop. */

import { type BatchAnswered, type BatchFailed, retryAfter } from "../core/delivery.js";
import { type DriverContext, USER_AGENT } from "./context.js";
import { readAtMost } from "./http.js";
import { CERTIFICATE_CODES } from "./redisFailure.js";

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
    const cause = (exc as { cause?: { code?: string; message?: string } }).cause;
    const code = cause?.code ?? "";
    if (CERTIFICATE_CODES.has(code) || code === "ERR_TLS_CERT_ALTNAME_INVALID") {
      // Nothing was sent, and no retry fixes it: delivery stalls and says why (no attempt used).
      const host = new URL(ctx.serverUrl).hostname;
      const reason = `the TLS certificate of ${host} did not verify (${cause?.message ?? code}): trust the CA that signed it with NODE_EXTRA_CA_CERTS`;
      return { kind: "BatchFailed", reason, maybeSent: false, stalls: true };
    }
    const refused = ["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH", "UND_ERR_CONNECT_TIMEOUT"];
    // A TLS handshake that failed sent nothing either (httpx's ConnectError in Python).
    if (refused.includes(code) || code.startsWith("ERR_SSL_") || code.startsWith("ERR_TLS_")) return { kind: "BatchFailed", reason: `could not connect to Polar: ${code}`, maybeSent: false };
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
