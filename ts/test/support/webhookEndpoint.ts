/** A webhook endpoint for the end-to-end tests: it hands each delivery to an Outpost instance
 * and answers what that says (401 on InvalidWebhook, 503 while there is no instance). */

import { once } from "node:events";
import { type Server, createServer } from "node:http";
import { InvalidWebhook, type Outpost } from "../../src/index.js";

/** A webhook endpoint that hands each delivery to `outpost` and answers what it says. */
export async function endpoint(target: () => Outpost | null): Promise<[Server, string, { statuses: number[] }]> {
  const seen = { statuses: [] as number[] };
  const server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => {
      const outpost = target();
      const answer = (status: number) => {
        seen.statuses.push(status);
        response.writeHead(status).end();
      };
      if (outpost === null) return answer(503);
      outpost.handleWebhook(Buffer.concat(chunks), request.headers).then(answer, (exc: unknown) => answer(exc instanceof InvalidWebhook ? 401 : 500));
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const address = server.address() as { port: number };
  return [server, `http://127.0.0.1:${address.port}/webhook`, seen];
}
