"""Replay trace files (recorded by the TypeScript SDK) through the Python core; print the first
mismatch of each, as JSON lines."""

from __future__ import annotations

import json
import random
import sys

from outpost_core.traces import replay_delivery, replay_session


def main() -> None:
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as file:
            records = [json.loads(line) for line in file if line.strip()]
        replay = replay_session if records[0]["machine"] == "session" else replay_delivery
        mismatches = replay(records, random.Random)
        first = [[m.line, m.what, m.expected, m.actual] for m in mismatches[:1]]
        sys.stdout.write(json.dumps({"file": path, "mismatches": first}, default=repr) + "\n")


if __name__ == "__main__":
    main()
