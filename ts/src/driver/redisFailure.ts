/** Which exceptions are Redis (or the way to it) failing, and which are bugs of ours (as
 * outpost_async/_context.py's failed_in_redis). A background loop retries the first as an outage
 * (backing off, one warning when it begins); the second reaches the loop's supervisor, which logs
 * it with its stack and restarts the loop: a bug retried as an outage would be misnamed in the
 * log and retried for ever. */

import { ReplyError } from "ioredis";
import { RedisUnavailable } from "../core/errors.js";

/** ioredis's message for a command whose connection closed (or never opened). */
export const CONNECTION_CLOSED = "Connection is closed.";
/** ioredis's message for a command sent while its connection is down and nothing queues it. */
export const NOT_WRITEABLE = "Stream isn't writeable";

/** A connection of ours to Redis is down (reconnecting after a failed attempt, dropped, or no node
 * serves a key): the driver's own word for it, where no client library error says so. */
export class RedisUnreachable extends Error {}

/** redis-errors' RedisError, the base of every error class ioredis has (ReplyError and the RESP3
 * replies' errors, ParserError, AbortError, InterruptError, MaxRetriesPerRequestError,
 * ClusterAllFailedError): ioredis exports only ReplyError, whose parent it is. */
const REDIS_ERROR = Object.getPrototypeOf((ReplyError as { prototype: object }).prototype).constructor as abstract new () => Error;

/** System errors of a socket or a name lookup: the way to Redis failing. */
const SOCKET_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "EHOSTDOWN",
  "ENETUNREACH",
  "ENETDOWN",
  "ENETRESET",
  "ENOTCONN",
  "EADDRNOTAVAIL",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EAI_FAIL",
]);

/** What OpenSSL says of a certificate it refuses (Node's "X509 certificate error codes"). */
export const CERTIFICATE_CODES = new Set([
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_CRL",
  "UNABLE_TO_DECRYPT_CERT_SIGNATURE",
  "UNABLE_TO_DECRYPT_CRL_SIGNATURE",
  "UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY",
  "CERT_SIGNATURE_FAILURE",
  "CRL_SIGNATURE_FAILURE",
  "CERT_NOT_YET_VALID",
  "CERT_HAS_EXPIRED",
  "CRL_NOT_YET_VALID",
  "CRL_HAS_EXPIRED",
  "ERROR_IN_CERT_NOT_BEFORE_FIELD",
  "ERROR_IN_CERT_NOT_AFTER_FIELD",
  "ERROR_IN_CRL_LAST_UPDATE_FIELD",
  "ERROR_IN_CRL_NEXT_UPDATE_FIELD",
  "OUT_OF_MEM",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "CERT_CHAIN_TOO_LONG",
  "CERT_REVOKED",
  "INVALID_CA",
  "PATH_LENGTH_EXCEEDED",
  "INVALID_PURPOSE",
  "CERT_UNTRUSTED",
  "CERT_REJECTED",
  "HOSTNAME_MISMATCH",
]);

/** The messages of the plain Errors ioredis makes for a connection that is down, closing or too
 * slow (it has no class for them), by how they begin. */
const IOREDIS_MESSAGES = [
  CONNECTION_CLOSED,
  NOT_WRITEABLE,
  "Command timed out", // commandTimeout ran out: Redis did not answer in time
  "Socket timeout", // socketTimeout ran out on a silent connection
  "None of startup nodes is available", // a cluster none of whose nodes answers
  "Cluster is disconnected.",
  "Cluster is disconnecting.",
  "Cluster isn't ready and enableOfflineQueue options is false",
  "Too many Cluster redirections.", // the slot map kept changing under the command (a fail-over)
  "Node is disconnected", // a cluster node dropped while the slot map was read from it
];

/** Whether `exc` is Redis (or the way to it) failing, not a bug of ours: an error of ioredis's own
 * classes (a reply error, MOVED, ASK, CLUSTERDOWN and TRYAGAIN among them; a command given up
 * after its connection failed), a socket's or a name lookup's system error, a TLS failure, one of
 * ioredis's plain errors for a connection that is down, or our own word for a Redis failure
 * (RedisUnavailable, RedisUnreachable). Anything else (a TypeError, a RangeError, a failed
 * invariant of the core, a misuse) is a bug of ours. */
export function failedInRedis(exc: unknown): boolean {
  // Our own: a Redis failure already named so, by the driver or a call it made.
  if (exc instanceof RedisUnavailable || exc instanceof RedisUnreachable) return true;
  if (!(exc instanceof Error)) return false;
  // Redis answered with an error, or ioredis gave a command up (its connection failed).
  if (ofRedisErrors(exc)) return true;
  const { code, syscall } = exc as { code?: unknown; syscall?: unknown };
  if (typeof code === "string") {
    // The socket to Redis (or the lookup of its name) failed: refused, reset, timed out...
    if (SOCKET_CODES.has(code) || syscall === "connect") return true;
    // The TLS handshake failed: a certificate refused, a peer that speaks no TLS.
    if (code.startsWith("ERR_TLS_") || code.startsWith("ERR_SSL_") || CERTIFICATE_CODES.has(code)) return true;
  }
  // ioredis's connection closed, or never opened, under the command: a plain Error it made.
  return Object.getPrototypeOf(exc) === Error.prototype && IOREDIS_MESSAGES.some((message) => exc.message.startsWith(message));
}

/** An error of redis-errors' classes: by its class, or by its ancestors' names for one made by
 * another copy of ioredis (an application's client, given as the `redis` option). */
function ofRedisErrors(exc: Error): boolean {
  if (exc instanceof REDIS_ERROR) return true;
  for (let proto: unknown = Object.getPrototypeOf(exc); proto !== null && proto !== Error.prototype; proto = Object.getPrototypeOf(proto)) {
    if ((proto as { constructor?: { name?: unknown } }).constructor?.name === "RedisError") return true;
  }
  return false;
}
