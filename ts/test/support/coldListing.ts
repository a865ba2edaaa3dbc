/** Core-test helper for the snapshot flow's two listings. */

import assert from "node:assert/strict";
import type { Session } from "../../src/core/session.js";

/** Answer the listing of the state hash `key` (a cold bucket, 300000000, and a hot one, 900000000,
 * for a snapshot cold until 600000000): return the tag of the cold bucket's events listing. */
export function coldListing(session: Session, key: string, tag: number): number {
  session.handle({ kind: "PendingListed", tag, fields: { [key]: ["rev", "a:300000000", new TextEncoder().encode("a:900000000")] } });
  const [next] = session.effects();
  assert.equal(next?.kind, "ListPending");
  assert.deepEqual((next as { keys: string[] }).keys, [`${key}:ev:300000000`]);
  return (next as { tag: number }).tag;
}
