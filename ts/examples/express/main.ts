/** Start the example: one Outpost per process, closed (its queue delivered) on SIGINT/SIGTERM. */

import { Outpost } from "../../src/index.js";
import { createApp } from "./app.js";

const meterId = process.env.OUTPOST_METER_ID ?? "";
if (!meterId) throw new Error("set OUTPOST_METER_ID to the id of the meter to read balances from");
const outpost = new Outpost();
const server = createApp(outpost, meterId).listen(Number(process.env.PORT ?? 3000));
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    server.close();
    void outpost.close();
  });
}
