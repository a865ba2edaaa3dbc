"""A Python Outpost instance the TypeScript interop test drives: one JSON command per line on
stdin, one JSON answer per line on stdout. Started with the repository's .venv."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from outpost_core import OutpostError
from outpost_sync import Outpost


def balance_of(outpost: Outpost, command: dict[str, Any]) -> dict[str, Any]:
    b = outpost.balance(command["meter_id"], external_customer_id=command["external_customer_id"])
    return {
        "balance": b.balance,
        "credited": b.credited,
        "consumed": b.consumed,
        "pending": b.pending,
        "undelivered": b.undelivered,
        "revision": b.revision,
        "held": b.held,
        "available": b.available,
        "snapshot_id": b.snapshot_id,
        "cold_until_us": None if b.cold_until is None else int(b.cold_until.timestamp() * 1e6),
    }


def answer(message: object) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    options = json.loads(sys.argv[1])
    outpost = Outpost(telemetry=False, **options)
    answer({"ready": True})
    reservations: dict[str, Any] = {}
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        try:
            if op == "track":
                result: Any = outpost.track(command.pop("name"), **command)
            elif op == "reserve":
                meter_id, units = command.pop("meter_id"), command.pop("units")
                reservation = outpost.reserve(meter_id, units, **command)
                result = f"r{len(reservations)}"
                reservations[result] = reservation
            elif op == "commit":
                held = reservations[command.pop("reservation")]
                result = held.commit(command.pop("name"), **command)
            elif op == "release":
                result = reservations[command.pop("reservation")].release()
            elif op == "balance":
                result = balance_of(outpost, command)
            elif op == "status":
                status = outpost.status
                result = {
                    "mode": getattr(status, "mode", "snapshots"),
                    "mode_reason": getattr(status, "mode_reason", ""),
                }
            elif op == "flush":
                result = outpost.flush(command.get("timeout", 10.0))
            elif op == "close":
                outpost.close(command.get("timeout", 10.0))
                answer({"ok": None})
                return
            else:
                raise ValueError(f"unknown op {op!r}")
            answer({"ok": result})
        except OutpostError as exc:
            answer({"error": [type(exc).__name__, str(exc)]})


if __name__ == "__main__":
    main()
