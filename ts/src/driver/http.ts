/** Reading an HTTP answer from Polar without letting its size cost more than a limit. */

/** At most `limit` bytes of `response`'s body: a peer's body of any size costs no more (the
 * rest is never fetched: the connection is let go). */
export async function readAtMost(response: Response, limit: number): Promise<Uint8Array> {
  if (response.body === null) return new Uint8Array(0);
  const parts: Uint8Array[] = [];
  let size = 0;
  const reader = response.body.getReader();
  try {
    while (size < limit) {
      const { done, value } = await reader.read();
      if (done) break;
      const part = value.subarray(0, limit - size);
      parts.push(part);
      size += part.length;
    }
  } finally {
    if (size >= limit) await reader.cancel().catch(() => {});
    else reader.releaseLock();
  }
  return parts.length === 1 ? (parts[0] as Uint8Array) : Buffer.concat(parts);
}
