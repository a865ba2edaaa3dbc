/** Secrets out of every output: a URL's password, and any known secret inside a text.
 *
 * A Redis URL (`redis://:password@host`, `?password=` in its query) and an access token must
 * never reach a log line, an error or a status. Printing a URL goes through these functions. */

import { isIP } from "node:net";
import type { Logger } from "./logger.js";

export const MASK = "***";
const SECRET_PARAMS = new Set(["password", "pass", "pwd", "token", "access_token", "secret"]);
const USERINFO = /(?<=\/\/)[^/@\s]*@/g;

/** `url` with its password (and any password-like query parameter) replaced by `***`; the user
 * name, host, port, path and the rest are kept. */
export function redactUrl(url: string): string {
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*:\/\/)([^/?#]*)(.*)$/s.exec(url);
  if (scheme === null) return url.replace(USERINFO, maskUserinfo);
  const [, head, authority, rest] = scheme as unknown as [string, string, string, string];
  let netloc = authority;
  const at = netloc.lastIndexOf("@");
  if (at >= 0) {
    const userinfo = netloc.slice(0, at);
    const colon = userinfo.indexOf(":");
    // a bare userinfo may be a token (redis://token@host): all of it goes
    netloc = `${colon >= 0 ? `${userinfo.slice(0, colon)}:${MASK}` : MASK}@${netloc.slice(at + 1)}`;
  }
  return head + netloc + redactQuery(rest);
}

function redactQuery(rest: string): string {
  const q = rest.indexOf("?");
  if (q < 0) return rest;
  const hash = rest.indexOf("#", q);
  const end = hash < 0 ? rest.length : hash;
  const pairs = rest.slice(q + 1, end).split("&");
  const masked = pairs.map((pair) => {
    const eq = pair.indexOf("=");
    const key = eq < 0 ? pair : pair.slice(0, eq);
    return SECRET_PARAMS.has(safeDecode(key).toLowerCase()) ? `${key}=${MASK}` : pair;
  });
  return rest.slice(0, q + 1) + masked.join("&") + rest.slice(end);
}

/** The secrets a URL carries (its password, or a bare user name that may be a token, its
 * password-like query values), to scrub from texts that may quote them. */
export function urlSecrets(url: string): string[] {
  const found: string[] = [];
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return [];
  }
  if (parsed.password) found.push(parsed.password);
  else if (parsed.username) found.push(parsed.username);
  for (const [key, value] of parsed.searchParams) if (SECRET_PARAMS.has(key.toLowerCase())) found.push(value);
  return [...new Set([...found, ...found.map(safeDecode)])].filter((s) => s);
}

/** `text` with each of `secrets` (and every URL's password in it) replaced by `***`. */
export function scrub(text: string, secrets: Iterable<string | null | undefined>): string {
  const known = [...new Set([...secrets].filter((s): s is string => !!s))].sort((a, b) => b.length - a.length);
  for (const secret of known) text = text.split(secret).join(MASK);
  return text.replace(USERINFO, maskUserinfo);
}

function maskUserinfo(match: string): string {
  const colon = match.indexOf(":");
  return colon >= 0 ? `${match.slice(0, colon)}:${MASK}@` : `${MASK}@`;
}

function safeDecode(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

/** Why sending a bearer token to `url` is unsafe (`http://` to a host that is not this machine:
 * anyone on the way reads the token), or null. */
export function cleartextTokenWarning(url: string, what: string): string | null {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return null;
  }
  if (parsed.protocol !== "http:" || loopback(parsed.hostname)) return null;
  return (
    `outpost sends the access token to the ${what} ${redactUrl(url)} over plain http://: ` +
    "anyone on the network path can read it; use https://"
  );
}

/** What to warn about once: the token sent over plain `http://` to another machine. */
export function cleartextWarnings(token: string | null, serverUrl: string, telemetry: boolean, telemetryUrl: string): string[] {
  if (!token) return [];
  const found = [cleartextTokenWarning(serverUrl, "server URL")];
  if (telemetry && telemetryUrl !== serverUrl) found.push(cleartextTokenWarning(telemetryUrl, "telemetry URL"));
  return found.filter((w): w is string => w !== null);
}

function loopback(host: string): boolean {
  const bare = host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host;
  if (bare === "localhost" || bare.endsWith(".localhost")) return true;
  const family = isIP(bare);
  if (family === 4) return bare.split(".")[0] === "127";
  if (family === 6) return bare === "::1" || /^::ffff:127\./i.test(bare) || /^(0+:){7}0*1$/.test(bare);
  return false;
}

/** `logger` with `secrets` (and every URL's password) scrubbed from each line. */
export function scrubbing(logger: Logger, secrets: (string | null)[]): Logger {
  const known = secrets.filter((s): s is string => !!s);
  const clean = (message: string): string => scrub(message, known);
  const { info, error } = logger;
  return {
    debug: (message) => logger.debug(clean(message)),
    warn: (message) => logger.warn(clean(message)),
    ...(info === undefined ? {} : { info: (message: string) => info.call(logger, clean(message)) }),
    ...(error === undefined ? {} : { error: (message: string) => error.call(logger, clean(message)) }),
  };
}
