"""One process of the fleet benchmark: ``python -m bench._fleet_tracker REDIS_URL SERVER_URL
TOKEN SECONDS``.

It starts an instance with default settings, says ``ready``, waits for a line on stdin (every
process starts together), tracks as fast as it can for SECONDS, flushes, and prints one JSON
line: events tracked, events dropped (``on_dropped``), whether the flush finished, and the
tracking time.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from outpost_sync import Outpost


def main(redis_url: str, server_url: str, token: str, seconds: str) -> None:
    dropped: list[int] = []

    def on_dropped(events: list[dict[str, Any]], reason: str) -> None:
        dropped.append(len(events))

    sdk = Outpost(
        access_token=token,
        server_url=server_url,
        redis_url=redis_url,
        telemetry=False,
        on_dropped=on_dropped,
    )
    try:
        sdk.track("api_call", external_customer_id="fleet-warm")  # configuration, connections
        print("ready", flush=True)
        sys.stdin.readline()
        tracked = 1
        start = time.perf_counter()
        deadline = start + float(seconds)
        while time.perf_counter() < deadline:
            for n in range(100):
                sdk.track("api_call", external_customer_id=f"fleet-{n % 50}")
            tracked += 100
        elapsed = time.perf_counter() - start
        flushed = sdk.flush(180)
    finally:
        sdk.close()
    result = {"tracked": tracked, "dropped": sum(dropped), "flushed": flushed, "s": elapsed}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
