/** Servers of the tests' own (a stand-in for Polar, an example's app) on loopback. */

import type { Server } from "node:net";

/** Listen on a free loopback port; the server's http:// URL. */
export async function listenOnLoopback(server: Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  return `http://127.0.0.1:${typeof address === "object" && address !== null ? address.port : 0}`;
}
