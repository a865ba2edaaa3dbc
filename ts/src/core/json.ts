/** `JSON.parse(text)`, or `fallback` where `text` is not JSON. */
export function jsonOr(text: string, fallback: unknown): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return fallback;
  }
}
