/** Standard Webhooks signatures, as Polar signs its webhooks (outpost_core/_webhook_signature.py):
 * `webhook-signature` holds space-separated `v1,<base64>` entries, each an HMAC-SHA256 of
 * "{id}.{timestamp}.{body}" keyed by the base64 part of the `whsec_` secret; the timestamp must be
 * within five minutes of now. The secret is the caller's (a malformed one throws); the headers
 * and body are the peer's (a verdict, never an exception). */

import { createHmac, timingSafeEqual } from "node:crypto";
import { UsageError } from "./errors.js";

export const TOLERANCE_S = 300;

export interface Verdict {
  genuine: boolean;
  reason: string;
  messageId: string;
}

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

export function secretKey(secret: string): Uint8Array {
  const encoded = secret.startsWith("whsec_") ? secret.slice("whsec_".length) : secret;
  if (!BASE64.test(encoded)) throw new UsageError("the webhook secret is not whsec_<base64>");
  if (encoded === "") throw new UsageError("the webhook secret is empty");
  return new Uint8Array(Buffer.from(encoded, "base64"));
}

export function sign(key: Uint8Array, messageId: string, timestamp: number, body: Uint8Array): string {
  const mac = createHmac("sha256", key);
  mac.update(`${messageId}.${timestamp}.`);
  mac.update(body);
  return `v1,${mac.digest("base64")}`;
}

function header(headers: Record<string, string | undefined>, name: string): string | undefined {
  for (const [key, value] of Object.entries(headers)) if (key.toLowerCase() === name) return value;
  return undefined;
}

export function verify(
  key: Uint8Array,
  headers: Record<string, string | undefined>,
  body: Uint8Array,
  nowS: number,
  toleranceS = TOLERANCE_S,
): Verdict {
  const messageId = header(headers, "webhook-id");
  const stamp = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  if (!messageId || stamp === undefined || signatures === undefined) {
    return { genuine: false, reason: "missing webhook-id, webhook-timestamp or webhook-signature", messageId: "" };
  }
  if (!/^[0-9]{1,12}$/.test(stamp)) return { genuine: false, reason: "webhook-timestamp is not Unix seconds", messageId };
  const timestamp = Number(stamp);
  if (Math.abs(nowS - timestamp) > toleranceS) {
    return { genuine: false, reason: "webhook-timestamp is too far from now", messageId };
  }
  const expected = Buffer.from(sign(key, messageId, timestamp, body));
  for (const entry of signatures.split(" ")) {
    const given = Buffer.from(entry);
    if (given.length === expected.length && timingSafeEqual(given, expected)) {
      return { genuine: true, reason: "", messageId };
    }
  }
  return { genuine: false, reason: "no signature matches", messageId };
}
